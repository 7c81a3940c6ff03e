"""Bad user input. The message is the one line the user sees (what was wrong, what is allowed);
the CLI prints it as `error: ...` and exits 2, before any run dir exists where it can.

Every user error derives from `UserError`, wherever it is raised (config, values, sweep planning,
model paths, the report): the CLI catches that one class. Anything else is a bug and keeps its
traceback.
"""


class UserError(Exception):
    """Input the tool cannot act on; its message is the whole story for the user."""


class ConfigError(UserError, ValueError):
    """A config, a data set or a machine that cannot run what was asked."""


class ReportError(UserError):
    """A sweep dir, a metric or a report option that cannot be reported on."""


class DamagedFile(ConfigError):
    """A file the tool reads back (manifest, status, overrides, checkpoint) that cannot be used.
    `path` and `problem` let the caller add what to do about it, which depends on the command."""

    def __init__(self, path, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"{path} {problem}")
