"""Bad user input. The message is the one line the user sees (what was wrong, what is allowed);
the CLI prints it as `error: ...` and exits 2, before any run dir exists where it can."""


class ConfigError(ValueError):
    """A config, a data set or a machine that cannot run what was asked."""


class ReportError(Exception):
    """A sweep dir, a metric or a report option that cannot be reported on."""
