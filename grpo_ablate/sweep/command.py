"""`grpo-ablate sweep` behind the CLI: its checked options (requests.SweepArgs) to a started sweep.

`run` continues a sweep (`--resume`: the plan is the manifest's, only how and where runs run
may change) or builds the planner's `SweepRequest` from the options — a mode's defaults, a
sweep file's fields under the command line's, the contexts, a conflict's trick and reward
term — and hands it to launch.py (a fixed set of seeds) or sequential.py (`--seeds auto`).
Bad input is a SweepError: the one line the CLI prints. sequential.py and the report's
curves (pandas, scipy) are imported only when a sweep needs them, so refusals stay fast.
"""
from __future__ import annotations

from pathlib import Path

from grpo_ablate.config.pair_rules import unknown_expected
from grpo_ablate.request_fields import flags, was_given
from grpo_ablate.sweep.requests import SWEEP_FILE_FIELDS, SweepArgs
from grpo_ablate.sweep.contexts import across_contexts, file_contexts
from grpo_ablate.sweep.launch import start
from grpo_ablate.sweep.manifest import read_manifest
from grpo_ablate.sweep.matrix import DEFAULT_MAX_RUNS, SweepError
from grpo_ablate.sweep.modes import FILE_MODES, MODES, REGISTRY, mode_named
from grpo_ablate.sweep.plan import DEFAULT_BASE, DEFAULT_SEEDS, DEFAULT_TRICKS, SweepRequest, axis_values
from grpo_ablate.values import check_sweep_file, load_yaml


def run(given: SweepArgs, console) -> int:
    """Resume or start the sweep `given` asks for; returns the exit code."""
    if given.resume_dir is not None:
        return resume(given, console)
    if given.rerun:
        raise SweepError("--rerun belongs to --resume SWEEP_DIR")
    request = sweep_request(given)
    if given.determinism:   # one run of the A/A sweep, twice: the training stack only in those runs
        if str(request.seeds) == "auto":
            raise SweepError(REGISTRY[request.mode].options["determinism"])
        given_too = [name for name, value in (("--placebos", given.placebos), ("--controls", given.controls))
                     if value is not None]
        if given_too:
            verb = "belongs" if len(given_too) == 1 else "belong"
            raise SweepError(f"--determinism trains the reference's first seed twice and nothing else: "
                             f"{' and '.join(given_too)} {verb} to the A/A sweep itself; drop one side")
        from grpo_ablate.sweep import determinism

        return determinism.check(request, console, dry_run=given.dry_run)
    if str(request.seeds) == "auto":
        if request.eval_name is not None or request.metric not in (None, "eval/accuracy", "accuracy"):
            raise SweepError("--seeds auto looks at each run's own eval/accuracy as the runs land; --metric and --eval "
                             "belong to a fixed number of seeds")
        from grpo_ablate.sweep import sequential   # the report's statistics (pandas, scipy)

        options = sequential.options_from(request.sequential)
        request.summary = options.summary
        return sequential.start(request, options, console, dry_run=given.dry_run)
    if set(request.sequential) - {"summary"}:
        raise SweepError(f"{', '.join('--' + k.replace('_', '-') for k in request.sequential)} "
                         "belong to --seeds auto (seeds until decided)")
    # a fixed sweep fixes what it decides on too (a sweep file's `summary:` or --summary)
    summary = request.sequential.pop("summary", None)
    request.summary = summary_label(str(summary)) if summary is not None else None
    return start(request, console, dry_run=given.dry_run)


def summary_label(text: str) -> str:
    """A summary (report/curves.py) as the label a manifest records."""
    from grpo_ablate.report.curves import Summary

    try:
        return Summary.parse(text, None).label
    except ValueError as err:
        raise SweepError(str(err)) from None


def resume(given: SweepArgs, console) -> int:
    """`sweep --resume DIR`: the plan is the manifest's; only how and where runs run may change."""
    planned = [flag.shown(name) for name, flag in flags(SweepArgs).items()
               if flag.resume == "refused" and was_given(getattr(given, name), flag.default)]
    dropped = planned + [a for a in given.args if not a.startswith("hydra.")]
    if dropped:
        raise SweepError(f"--resume continues a sweep exactly as it was planned; drop {', '.join(dropped)} "
                         "(only --launcher, --jobs, hydra.* launcher settings and, for --seeds auto, "
                         "--max-seeds and --budget may change)")
    read_manifest(given.resume_dir)   # not a sweep dir, or a damaged manifest: refused before the imports below
    from grpo_ablate.sweep import sequential

    rerun = tuple(r.strip() for r in (given.rerun or "").split(",") if r.strip())
    return sequential.resume_any(given.resume_dir, given.launcher, given.jobs,
                                 [a for a in given.args if a.startswith("hydra.")], console,
                                 {"max_seeds": given.max_seeds, "budget": given.budget}, rerun)


def _given(name: str, value) -> bool:
    """Whether SweepArgs' option `name` was given this value (request_fields.was_given, against its default)."""
    return was_given(value, flags(SweepArgs)[name].default)


def check_mode_options(mode: str, chosen: dict) -> None:
    """An option that belongs to one mode (its SweepMode.options), given with another, is refused."""
    for owner in REGISTRY.values():
        given = [name for name in owner.options if _given(name, chosen.get(name))]
        if given and owner.name != mode:
            raise SweepError(owner.options[given[0]])


def sweep_request(given: SweepArgs) -> SweepRequest:
    """The planner's request: the mode (or a sweep file) with the command line's options over it."""
    mode, args, spec, tricks = given.mode, list(given.args), {}, given.tricks
    if mode is None:
        raise SweepError(f"give a sweep mode: {', '.join(MODES)}, or file PATH (or --resume SWEEP_DIR)")
    if mode == "file":
        if not args or "=" in args[0]:
            raise SweepError("sweep file needs the path of a sweep definition: "
                             "grpo-ablate sweep file sweeps/dapo-ladder.yaml")
        path, args = Path(args[0]), args[1:]
        spec = load_sweep_file(path)
        mode = spec.pop("mode")
        spec.setdefault("name", path.stem)
    own = REGISTRY[mode] if spec and mode in FILE_MODES else mode_named(mode)   # a file-only mode from a file
    chosen = given_over_file(given, spec)
    options = {**chosen, **{name: getattr(given, name) for mode_ in REGISTRY.values() for name in mode_.options
                            if name not in chosen}}
    check_mode_options(mode, options)
    if spec.get("families") and "family" not in own.options:   # the file's form of --family, never ignored
        owner = next(m for m in REGISTRY.values() if "family" in m.options)
        raise SweepError(f"`families:` in a sweep file is --family: {owner.options['family']}")
    if own.tricks_from is not None and (not spec or any(_given(name, options.get(name)) for name in own.options)):
        tricks = own.tricks_from(given)   # the mode's own options as its trick list (conflict's --trick, --reward)
    trick_list = [t.strip() for t in tricks.split(",") if t.strip()] if tricks else spec.get("tricks", [])
    axes = [axis_values(a) for a in given.family] if given.family else [
        (key, list(values)) if values is not None else axis_values(key)
        for key, values in (spec.get("families") or {}).items()]
    base = chosen["base"]
    if own.default_tricks and not trick_list and not spec:
        trick_list, base = DEFAULT_TRICKS, base or DEFAULT_BASE
    overrides = list(spec.get("overrides", [])) + [a for a in args if not a.startswith("hydra.")]
    bad = [a for a in overrides if a.startswith("-")]
    if bad:
        raise SweepError(f"unknown option {bad[0]}; see grpo-ablate sweep --help")
    matrix = None
    if own.file_only:   # a file's own variants, each against its reference (sweeps/sanity.yaml)
        if tricks or given.family:
            raise SweepError(f"a {mode} sweep file defines its variants itself; drop --tricks / --family")
        matrix = own.build(spec.get(mode))
    or_default = lambda name, default: default if chosen[name] is None else chosen[name]
    return SweepRequest(
        mode=mode, tricks=trick_list, base=base, matrix=matrix, seeds=or_default("seeds", DEFAULT_SEEDS),
        overrides=overrides, hydra_args=[a for a in args if a.startswith("hydra.")],
        launcher=or_default("launcher", "joblib"), jobs=given.jobs,
        max_runs=or_default("max_runs", DEFAULT_MAX_RUNS), axes=axes, name=chosen["name"], steps=chosen["steps"],
        sweep_dir=given.out, controls=chosen["controls"], allow_inert=given.allow_inert,
        control_budget=given.control_budget or "tokens",
        contexts=(across_contexts(list(given.across)) if given.across
                  else file_contexts(spec["contexts"]) if "contexts" in spec else []),
        sequential={k: chosen[k] for k in SEQUENTIAL if chosen[k] is not None},
        expected_pairs=list(spec.get("expected_pairs", [])),
        mode_options={name: options[name] for name in own.options if _given(name, options.get(name))},
        metric=chosen["metric"], eval_name=chosen["eval"])


# the options of --seeds auto (sequential.py), from the command line or a sweep file
SEQUENTIAL = ("max_seeds", "budget", "effect", "summary")


def given_over_file(given: SweepArgs, spec: dict) -> dict:
    """Each option a sweep file may set too: the command line's value where it was given, else the
    file's; None where neither gives it (the planner's default)."""
    return {name: getattr(given, name) if was_given(getattr(given, name), flag.default) else spec.get(name)
            for name, flag in flags(SweepArgs).items() if flag.file}


def load_sweep_file(path: Path) -> dict:
    """A sweep file's fields, each checked (values.py), null ones dropped (= the default)."""
    import yaml

    if not path.exists():
        raise SweepError(f"sweep file {path} does not exist (the shipped ones are in sweeps/)")
    try:
        spec = load_yaml(path.read_text())
    except yaml.YAMLError as err:
        raise SweepError(f"sweep file {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SweepError(f"sweep file {path} cannot be read: {err}") from None
    check_sweep_file(path, {} if spec is None else spec, SWEEP_FILE_FIELDS)   # every field of its kind and in its range
    if spec and (problem := unknown_expected(spec.get("expected_pairs") or [])):
        raise SweepError(f"sweep file {path}: {problem}")
    spec = {key: value for key, value in (spec or {}).items() if value is not None}   # null: the default
    if "mode" not in spec:
        raise SweepError(f"sweep file {path} has no mode; allowed: {', '.join((*MODES, *FILE_MODES))}")
    file_only = spec["mode"] in FILE_MODES
    if any((name == spec["mode"]) != (name in spec) for name in FILE_MODES) or (file_only and "tricks" in spec):
        raise SweepError(f"sweep file {path}: `variants` (name -> overrides) goes with mode: variants, "
                         "and a variants file lists no tricks")
    spec.pop("description", None)
    return spec
