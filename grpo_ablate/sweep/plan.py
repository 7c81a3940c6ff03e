"""What a sweep runs: its request, and the planned runs of a matrix in its contexts.

`plan` turns a `SweepRequest` (mode, tricks, base, seeds, axes, contexts, overrides) into the
manifest of a new sweep, every run pending: each run's config composed, validated and hashed,
the no-RL controls added, a trick setting given for the whole sweep scoped to the variants
whose option has it, and a trick under test that cannot act here refused. It writes nothing
(the sweep dir is manifest.py's, starting runs launch.py's), so bad input leaves nothing behind.
"""
from __future__ import annotations

import copy
import json
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from omegaconf import OmegaConf

from grpo_ablate.config.catalogue import load_catalogue
from grpo_ablate.config.compose import compose
from grpo_ablate.config.here import check_here
from grpo_ablate.config.identity import config_hash, data_hash
from grpo_ablate.config.validate import family_keys, parses_answers, trick_families, validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.config.inert import inert_reason
from grpo_ablate.model_source import gguf_source, warm_start_dir
from grpo_ablate.config.pair_rules import variant_lines
from grpo_ablate.rundir.paths import NAME_MAX
from grpo_ablate.design import STREAM_SALT, Context
from grpo_ablate.evals.protocol import EvalProtocol, metric_column, parse_metric
from grpo_ablate.sweep.contexts import check_contexts, with_contexts
from grpo_ablate.sweep.controls import control_kinds, planned_controls, with_controls
from grpo_ablate.sweep.manifest import timestamp
from grpo_ablate.sweep.matrix import (DEFAULT_MAX_RUNS, NAME_PATTERN, Matrix, SweepError,
                                      check_runs, check_size, expand_jobs, parse_seeds)
from grpo_ablate.sweep.modes import REGISTRY, build_matrix
from grpo_ablate.tasks import TASKS, build_task
from grpo_ablate.tricks import option


# What `grpo-ablate sweep leave-one-out` runs with no options: the seed review's recommended
# tricks on vanilla GRPO, plus DAPO's dynamic sampling (on the embedded task most groups are
# all-correct or all-wrong, so which groups a step trains on is part of the default question)
# and Dr. GRPO's advantages without the group std (a disputed choice: GRPO divides by it,
# Dr. GRPO drops it against a difficulty bias, Tricks or Traps finds dropping it steadier on
# easy data), on the embedded default, five seeds; measured in docs/calibration.md.
DEFAULT_TRICKS = ["kl_adaptive", "length_group", "entropy_adaptive", "learnable_temperature", "dynamic_sampling",
                  "no_std"]
DEFAULT_BASE = "grpo"
# Five, not three: paired over 3 seeds, a 95% interval excludes zero only for an effect above
# ~2.5 of its paired SDs (t = 4.30 at 2 df; at 5 seeds, t = 2.78 and ~1.2 SDs), and on the
# embedded default the paired SD of a trick's effect is 0.04-0.09 accuracy: at three seeds
# this question decides none of its six tricks, at five two (docs/calibration.md). --seeds
# auto spends seeds only where a contrast is still open.
DEFAULT_SEEDS = "5"
# launchers whose runs run on this machine (a cluster's run where its jobs land: checked there)
LOCAL_LAUNCHERS = ("basic", "joblib", "submitit_local")
# keys a sweep sets itself; the user chooses them through the sweep's own options
_RESERVED = {"seed": "--seeds", "trick": "--tricks", "+trick": "--tricks", "preset": "--base",
             "resume": "--resume", "control": "--controls",
             STREAM_SALT: "sweep aa --placebos (each placebo gets its own; the reference keeps 0)"}


@dataclass
class SweepRequest:
    mode: str
    tricks: list[str] = field(default_factory=list)
    base: str | None = None
    seeds: str | int | list = DEFAULT_SEEDS
    overrides: list[str] = field(default_factory=list)    # train overrides common to every run
    hydra_args: list[str] = field(default_factory=list)   # hydra.* overrides (launcher settings)
    launcher: str = "joblib"
    jobs: int | None = None
    max_runs: int = DEFAULT_MAX_RUNS
    axes: list[tuple[str, list]] = field(default_factory=list)
    name: str | None = None
    steps: int | None = None
    sweep_dir: Path | None = None
    controls: bool | None = None     # None: on for the embedded default, off for model.path models
    control_budget: str = "tokens"   # the SFT control's budget: tokens | wall (the treatments' time)
    allow_inert: bool = False        # run tricks under test that cannot act here (config/inert.py) anyway
    matrix: Matrix | None = None        # a matrix built by the caller (doctor) instead of `mode`
    group: str | None = None            # W&B group shared with other sweeps (doctor's stages)
    sequential: dict = field(default_factory=dict)   # seeds=auto: max_seeds, budget, effect (sweep/sequential.py)
    contexts: list[Context] = field(default_factory=list)   # --across / a file's contexts: the matrix in each
    summary: str | None = None       # what the sweep decides on (report/curves.py label), fixed before any run
    metric: str | None = None        # ... of which eval metric (None: eval/accuracy)
    eval_name: str | None = None     # ... of which eval protocol scored after training (None: the runs' own)
    expected_pairs: list[str] = field(default_factory=list)   # pair rules the sweep asks about (config/pair_rules.py)
    mode_options: dict = field(default_factory=dict)   # the mode's own options as given (aa: placebos)


# What a sweep decides on unless told: the mean of the last three evals (on the default sweep
# it halves the paired SD of the final eval, which a peaking-then-drifting curve makes noisy; docs/calibration.md,
# "Calibration"). Fixed in the manifest before the first run.
DECISION_METRIC, DECISION_SUMMARY = "eval/accuracy", "last_3"


def plan(req: SweepRequest, configs: dict | None = None) -> dict:
    """The manifest of a new sweep (statuses pending), fully validated; writes nothing but `configs`' variants."""
    catalogue = load_catalogue()
    families = {row["name"]: row["family"] for row in catalogue}
    options = {row["name"]: row["option"] for row in catalogue}
    # the named tricks that add a term to the reward (`sweep conflict --reward`): the registry's flag
    reward_terms = frozenset(row["name"] for row in catalogue if option(row["family"], row["option"]).shapes_reward)
    _check_overrides(req.overrides)
    seeds = parse_seeds(req.seeds)
    mode = REGISTRY.get(req.mode)
    if req.matrix is None and mode is not None and mode.size is not None:   # refused before it is built
        check_runs(req.mode, mode.size(req.tricks, **req.mode_options), seeds, req.max_runs, mode.fewer)
    matrix = req.matrix or build_matrix(req.mode, req.tricks, families, req.axes, reward_terms, **req.mode_options)
    common = ([f"preset={req.base}"] if req.base else []) + list(req.overrides)
    if req.steps is not None:
        common.append(f"steps={req.steps}")
    if req.eval_name is not None and (req.summary or "final") != "final":
        common.append("eval.keep_weights=true")   # a curve of the eval scored after training: each eval step's weights
    if req.contexts:
        check_contexts(req.contexts, matrix, families, common)
        for context in req.contexts:   # a bad value is named by its context, before any run is composed
            compose_run(common + list(context.overrides), f"context {context.name}")
    common, matrix = scope_trick_settings(common, matrix)   # no context may set a trick's family
    base_cfg = compose_run(common, "the base")
    matrix = plan_controls(req, matrix, common, base_cfg)   # before the contexts: each context gets its own
    if req.contexts:   # the matrix repeated in every context
        matrix = with_contexts(matrix, req.contexts)
    check_size(matrix, seeds, req.max_runs, mode.fewer if mode is not None else "tricks")
    _check_not_in_base(req, base_cfg, families, options)
    sweep_id = time.strftime("%Y-%m-%d_%H-%M-%S")
    name = req.name or req.mode
    _check_name(name, sweep_id)
    group = req.group or f"{name}-{sweep_id}"
    labels = {"name": name, "id": sweep_id, "group": group, "tricks": list(req.tricks)}
    cfg_of: dict = {} if configs is None else configs   # variant -> its first run's config, for the inert check
    first_of: dict = {}   # variant -> (overrides, config) of its first run: the other seeds start from it
    runs = [run_entry(job, cfg_of, first_of) for job in expand_jobs(matrix, seeds, common, labels)]
    if not req.allow_inert:
        check_tricks_act(matrix, cfg_of, {t: (families[t], options[t]) for t in families})
    if req.launcher in LOCAL_LAUNCHERS:
        _check_runs_here(cfg_of)
    now = timestamp()
    return {
        "version": 1, "sweep_id": sweep_id, "name": name, "mode": matrix.mode, "base": req.base,
        "tricks": list(req.tricks), "axes": {k: v for k, v in req.axes}, "seeds": seeds,
        "overrides": common, "launcher": req.launcher, "wandb_group": group,
        "created_at": now, "updated_at": now,
        **({"contexts": [c.to_json() for c in req.contexts]} if req.contexts else {}),
        **pair_fields(req, cfg_of),
        "variants": [v.to_json() for v in matrix.variants],
        "contrasts": [c.to_json() for c in matrix.contrasts],
        "controls": planned_controls(matrix.variants),
        # fixed before the first run: the report decides on this; another summary is exploratory there
        "decides_on": decides_on(req, common, base_cfg),
        # fixed before the first run too: the report tests training against its start in each context
        # (report/training.py) before any trick verdict
        "checks_training": True,
        "runs": runs,
    }


def _check_not_in_base(req: SweepRequest, base_cfg, families: dict, options: dict) -> None:
    """Dropping a trick the base already has would change nothing: refused."""
    for trick in req.tricks:
        family = families[trick]
        if base_cfg[family].name == options[trick]:
            where = 'preset=' + req.base if req.base else 'the defaults'
            raise SweepError(f"trick {trick} is already on in the base ({where} "
                             f"sets {family}={options[trick]}), so switching it off would change nothing; "
                             "remove it from --tricks or pick another --base")


def decides_on(req: SweepRequest, common: list[str], base_cfg) -> dict:
    """What the report decides on, fixed before the first run: a metric of the runs' own eval (or of the
    protocol `--eval` names, scored after training: its settings recorded too) and its summary (`final` for an
    eval after training, scored at the start and the final checkpoint)."""
    metric = metric_column(req.metric or DECISION_METRIC)
    kind = parse_metric(metric)
    if kind is None:
        raise SweepError(f"--metric {req.metric!r} is not allowed; allowed: eval/accuracy (avg@n), pass@k, maj@k (the "
                         "eval's metrics, k up to its samples per problem)")
    group = base_cfg.eval if req.eval_name is None else compose_run(common + [f"eval={req.eval_name}"],
                                                                     f"--eval {req.eval_name}").eval
    protocol = EvalProtocol.from_group(group).resolved(parses_answers(base_cfg.task.name))
    what, k = kind
    if what != "avg" and (k > protocol.samples or (what == "maj" and not protocol.maj_k)):
        whose = f"eval {protocol.name}" if req.eval_name else f"the runs' eval ({protocol.name})"
        raise SweepError(f"--metric {req.metric}: {whose} draws {protocol.samples} sample(s) per problem"
                         + (" and parses no answers to vote on" if what == "maj" and not protocol.maj_k else "")
                         + f"; {what}@{k} needs k <= the samples (eval=sampled: 8)")
    summary = req.summary or (DECISION_SUMMARY if req.eval_name is None else "final")
    return {"metric": metric, "summary": summary,
            **({"eval": req.eval_name, "eval_protocol": protocol.settings()} if req.eval_name else {})}


def pair_fields(req: SweepRequest, cfg_of: dict) -> dict:
    """The manifest's pair rules (config/pair_rules.py: settings that change what a trick means), said before
    the first run, one line each naming its variants; and those the sweep file expects (not said)."""
    lines = variant_lines(cfg_of, req.expected_pairs)
    return {**({"expected_pairs": list(req.expected_pairs)} if req.expected_pairs else {}),
            **({"pair_rules": lines} if lines else {})}


def plan_controls(req: SweepRequest, matrix: Matrix, common: list[str], base_cfg) -> Matrix:
    """`matrix` with the no-RL controls this sweep plans (sweep/controls.py): the untrained base
    in every sweep but a diagnosis (doctor's stages, the conflict check) or a `--family`
    factorial; the SFT and RFT controls where asked, or unasked where every run trains the
    embedded model (no model.path in the base or any context), SFT only in the contexts whose
    task has reference solutions."""
    if req.controls is False:
        return matrix
    # none unasked for doctor's stages, the conflict check and an A/A sweep (diagnoses: of training,
    # of the report), nor for a factorial over config groups (`--family`: settings crossed, fault
    # injection among them, no trick under test)
    unasked_none = req.matrix is not None or REGISTRY[req.mode].diagnosis or bool(req.axes)
    kinds = control_kinds(req.controls, not base_cfg.model.get("path"), unasked_none)
    if "sft" not in kinds:
        return with_controls(matrix, kinds)
    contexts = req.contexts or [Context("", ())]
    cfgs = {c.name: compose_run(common + list(c.overrides), f"context {c.name}") if c.name else base_cfg
            for c in contexts}
    if req.controls is None and any(cfg.model.get("path") for cfg in cfgs.values()):
        kinds = ("base",)   # a context's own model: an SFT or RFT run there costs as much as asking for it
    has = [name for name, cfg in cfgs.items() if _has_solutions(cfg)]
    kinds = kinds if has else tuple(k for k in kinds if k != "sft")   # RFT needs only the verifier
    where = tuple(has) if req.contexts and len(has) < len(contexts) else ()   # empty: every context
    return with_controls(matrix, kinds, req.control_budget, where)


def scope_trick_settings(common: list[str], matrix: Matrix) -> tuple[list[str], Matrix]:
    """A setting of a trick family's option given for the whole sweep (`++temperature.lr=100`
    while only some variants have temperature=learnable) goes to the variants whose option has
    that setting: given to the others it would be recorded in a config it cannot act on. A
    setting no variant's option has is refused (a typo) with the allowed ones."""
    scoped, rest = [], []
    for override in common:
        family, _, setting = override.lstrip("+~").split("=", 1)[0].partition(".")
        if family in trick_families() and setting and "." not in setting:
            scoped.append((override, family, setting))
        else:
            rest.append(override)
    if not scoped:
        return common, matrix
    variants, taken = [], set()
    for v in matrix.variants:
        cfg = compose_run(rest + list(v.overrides), f"variant {v.name}")
        extra = tuple(o for o, family, setting in scoped if setting in family_keys(cfg, family))
        taken |= set(extra)
        variants.append(replace(v, overrides=v.overrides + extra))
    for override, family, setting in scoped:
        if override not in taken:
            allowed = ", ".join(sorted(family_keys(compose_run(rest, "the base"), family))) or "(none)"
            raise SweepError(f"'{override}': {family}.{setting} is not a setting of the {family} option of any "
                             f"variant; allowed: {allowed}")
    return rest, Matrix(matrix.mode, variants, matrix.contrasts)


def _check_runs_here(cfg_of: dict) -> None:
    """The runs of a local launcher run on this machine: what `train` would refuse here (config/here.py:
    vLLM not installed, no GPU) is refused at planning, not once per run in a dir of failed runs."""
    for variant, cfg in cfg_of.items():
        try:
            check_here(cfg)
        except ConfigError as err:
            raise SweepError(f"variant {variant}: {err}") from None


def check_tricks_act(matrix: Matrix, cfg_of: dict, tricks: dict) -> None:
    """Refuse a plan in which a trick under test cannot act (config/inert.py): for each contrast, the
    trick on the side that has it; without contrasts (doctor), every trick where all are on;
    for a factorial over config groups, every variant's options. `tricks`: name -> (family, option)."""
    checks = [(c.tested, *tricks[c.tested], c.with_) for c in matrix.contrasts if c.tested in tricks]
    if not matrix.contrasts and matrix.variants:
        widest = max(matrix.variants, key=lambda v: len(v.tricks_on))
        checks += [(t, *tricks[t], widest.name) for t in widest.tricks_on]
    for v in matrix.variants:
        checks += [(f"{key}={value}", key, str(value), v.name) for key, value in v.axes.items()
                   if key in trick_families() or key == "kl.estimator"]
    for name, family, opt, variant in checks:
        reason = inert_reason(cfg_of[variant], family, opt)
        if reason is not None:
            raise SweepError(f"{name} {reason} (or pass --allow-inert to run it anyway)")


WALL_STAND_IN = "control.wall_s=1"   # a deferred control's budget while planning: the real one is measured


def planned_overrides(run: dict) -> list[str]:
    """What a planned run composes with: a deferred control's with the stand-in budget."""
    return list(run["overrides"]) + ([WALL_STAND_IN] if run.get("deferred") else [])


def run_entry(job, configs: dict | None = None, firsts: dict | None = None) -> dict:
    """One job as the manifest lists it (pending), its config validated and hashed (and kept
    in `configs` by variant, the first seed's, when given). With `firsts` (variant -> the first
    seed's overrides and config), another seed of a variant is hashed from its first's config with
    this seed's values, not a new composition (~0.1-1 s each: a 70-run plan composed 70 times)."""
    # a wall-clock SFT control learns its budget from the treatments' runs: checked here with
    # a stand-in, hashed once the budget is known (launch.run_jobs)
    deferred = "control.budget=wall" in job.overrides
    overrides = list(job.overrides) + ([WALL_STAND_IN] if deferred else [])
    first = firsts.get(job.variant) if firsts else None
    values = seed_values(first[0], overrides) if first else None
    if values is not None:
        digest = None if deferred else _hash_with(first[1], values, first[2])
    else:
        cfg = compose_run(overrides, f"run {job.run_dir}")
        plain = None if deferred else _plain_values(cfg)   # made once: this run's hash, and its other seeds'
        if firsts is not None:
            firsts.setdefault(job.variant, (overrides, cfg, plain))
        if configs is not None:
            configs.setdefault(job.variant, cfg)
        digest = None if deferred else data_hash(copy.deepcopy(plain)) if plain is not None else config_hash(cfg)
    return {"variant": job.variant, "seed": job.seed, "run_dir": job.run_dir,
            "config_hash": digest, "status": "pending", "step": 0,
            "reason": None, "final_accuracy": None, "overrides": list(job.overrides),
            **({"deferred": "control.wall_s"} if deferred else {})}


# what expand_jobs changes between the seeds of one variant: plain values, set last
PER_SEED_KEYS = {"seed": int, "run.name": str}


def seed_values(first_overrides: list[str], overrides: list[str]) -> dict | None:
    """The values (key -> value) that turn the config of a variant's first seed into the one
    `overrides` compose to, when the two differ only in PER_SEED_KEYS (else None: compose it).
    Equal to composing, since those overrides are plain values given after every group choice,
    and interpolations that read them (`${seed}`) resolve when read; tests/test_sweep.py checks
    the hashes agree."""
    if len(first_overrides) != len(overrides):
        return None
    changed = [o for first, o in zip(first_overrides, overrides) if first != o]
    if any(o.split("=", 1)[0] not in PER_SEED_KEYS for o in changed):
        return None
    return {key: PER_SEED_KEYS[key](value) for key, value in (o.split("=", 1) for o in changed)}


def _hash_with(cfg, values: dict, plain: dict | None) -> str:
    """config_hash of `cfg` with `values` set, `cfg` left as it was. Where no interpolation of `cfg`
    reads a per-seed key, from `plain`, its values made once per variant by _plain_values (making them
    is most of a hash's cost, and a plan hashes every seed of every variant), else from a copy of `cfg`."""
    if plain is not None:
        data = copy.deepcopy(plain)
        for key, value in values.items():
            *parents, leaf = key.split(".")
            node = data
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = value
        return data_hash(data)
    cfg = copy.deepcopy(cfg)   # compose_run's config is read-only: shared
    OmegaConf.set_readonly(cfg, None)
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return config_hash(cfg)


def _plain_values(cfg) -> dict | None:
    """`cfg` resolved to plain values; None where an interpolation may read a per-seed key."""
    raw = json.dumps(OmegaConf.to_container(cfg, resolve=False), default=str)
    if any(key.split(".")[0] in text for text in re.findall(r"\$\{[^\"]*", raw) for key in PER_SEED_KEYS):
        return None
    return OmegaConf.to_container(cfg, resolve=True)


def _has_solutions(cfg) -> bool:
    return bool(getattr(build_task(cfg.task).train_batch(1, 0, 0)[0], "solution", None))


def _check_name(name: str, sweep_id: str) -> None:
    """A sweep's name names its dir (`runs/sweeps/<name>-<id>[-N]`) and labels every run (`sweep.name=`):
    a plain name short enough for the file system, nothing that leaves runs/sweeps/."""
    longest = NAME_MAX - len(f"-{sweep_id}-99")
    if not re.fullmatch(NAME_PATTERN, name) or set(name) == {"."} or len(name.encode()) > longest:
        shown = name if len(name) <= 40 else f"{name[:40]}... ({len(name)} characters)"
        raise SweepError(f"sweep name {shown!r} is not allowed; use letters, digits and _ . + -, at most {longest} "
                         "characters (it names the sweep dir under runs/sweeps/)")


def _check_overrides(overrides: list[str]) -> None:
    for o in overrides:
        key = o.split("=", 1)[0]
        bare = key.lstrip("+~")
        if key in _RESERVED or bare in _RESERVED:
            raise SweepError(f"'{o}': a sweep sets {bare} itself; use {_RESERVED.get(key, _RESERVED.get(bare))}")
        if bare.split(".")[0] in ("run", "sweep"):
            raise SweepError(f"'{o}': run.* and sweep.* are the labels a sweep gives each run; "
                             "name the sweep with --name")


def compose_run(overrides: list[str], what: str):
    """The validated config `overrides` compose to, read-only (shared by every caller in this process);
    a bad one is a SweepError naming `what`."""
    try:
        cfg = compose(overrides, shared=True)
        validate(cfg)
    except ConfigError as err:
        raise SweepError(f"{what}: {err}") from None
    return cfg


def composed_hash(overrides: list[str]) -> str:
    """The config hash `overrides` compose to now (resume compares it with the planned one)."""
    return config_hash(compose_run(list(overrides), "a resumed run"))


PLANNED_BEFORE_PROTOCOLS = "eval=greedy"   # the one eval there was before the eval group (conf/eval/)


def chooses_eval(overrides: list[str]) -> bool:
    return any(o.lstrip("+").split("=", 1)[0] == "eval" for o in overrides)


def pin_planned_eval(manifest: dict) -> bool:
    """A sweep planned before the eval group's default became `sampled` evaluated greedily, and chose no
    protocol: its runs compose to their planned hashes only with eval=greedy. Pinned in the manifest's
    overrides (the sweep's and each run's), so that a resume runs, and plans its next runs, as it was
    planned; True when pinned (the caller writes the manifest)."""
    if chooses_eval(manifest.get("overrides") or []):
        return False
    run = next((r for r in manifest["runs"] if not r.get("deferred") and r.get("config_hash")
                and not chooses_eval(r["overrides"])), None)
    if run is None or composed_hash(run["overrides"]) == run["config_hash"] or \
            composed_hash([PLANNED_BEFORE_PROTOCOLS, *run["overrides"]]) != run["config_hash"]:
        return False
    manifest["overrides"] = [PLANNED_BEFORE_PROTOCOLS, *manifest["overrides"]]
    for r in manifest["runs"]:
        if not chooses_eval(r["overrides"]):
            r["overrides"] = [PLANNED_BEFORE_PROTOCOLS, *r["overrides"]]
    return True


def axis_values(spec: str) -> tuple[str, list]:
    """`--family adv` (every option of a config group), `--family task.level` (the values the
    task allows) or `--family key=a,b` (those values)."""
    from importlib import resources

    key, _, values = spec.partition("=")
    key = key.strip()
    if values:
        return key, [_typed(v.strip()) for v in values.split(",") if v.strip()]
    group = resources.files("grpo_ablate.conf").joinpath(key)
    if "." not in key and group.is_dir():
        return key, sorted(p.name[:-5] for p in group.iterdir() if p.name.endswith(".yaml"))

    if key.startswith("task."):
        choices = getattr(TASKS[compose_run([], "the defaults").task.name], "CHOICES", {})
        if key[len("task."):] in choices:
            return key, list(choices[key[len("task."):]])
    raise SweepError(f"--family {key}: not a config group and no known values; give them: "
                     f"--family {key}=a,b,c")


def _typed(text: str):
    """`0`, `-1`, `0.5`, `true` as numbers and booleans, anything else as text (YAML rules)."""
    import yaml

    value = yaml.safe_load(text)
    return value if isinstance(value, (int, float, bool)) else text


def warm_starts_to_build(manifest: dict, configs: dict | None = None) -> list[str]:
    """The embedded models a sweep will warm-start before its first run (not cached yet), one line each:
    a context with another task (`--across task.level=easy,hard`) needs a model of its own. `configs`:
    the variants' configs plan() gave, else each variant's first run is composed again."""
    seen, targets, lines = set(), set(), []
    tasks: dict = {}   # a task's settings -> it, built once: most variants share the task (~7 ms each)
    for run in manifest["runs"]:
        if run["variant"] in seen:
            continue
        seen.add(run["variant"])
        # validated by the plan already: compose_run would check it again
        cfg = configs[run["variant"]] if configs and run["variant"] in configs else compose(planned_overrides(run))
        if cfg.model.get("path") or gguf_source(cfg.model) is not None:
            continue
        settings = json.dumps(OmegaConf.to_container(cfg.task, resolve=True), sort_keys=True, default=repr)
        if settings not in tasks:
            tasks[settings] = build_task(cfg.task)
        target = warm_start_dir(cfg.model, tasks[settings])
        if not (target / "config.json").exists() and target not in targets:
            targets.add(target)
            lines.append(f"first warm-starts the embedded model for {run['variant']} (not cached yet; minutes "
                         f"on 2 cores), cached as {target}")
    return lines
