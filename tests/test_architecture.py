"""The package's shape: data flows one way, with no import cycle, and the trick catalogue is pure math.

cli -> {rescore, sweep} -> {train, report} -> config -> {evals, models} -> {tricks, tasks, rundir}
-> {sampling, stats}, between modules and between packages. Every import of a grpo_ablate module
counts, also one inside a function (that is how cycles hide); inside functions such imports are
allowed only in LAZY_ALLOWED (cli/app.py first), which load a command's modules when the command
runs (so `grpo-ablate report` never imports torch). Optional third-party packages (vllm, peft,
datasets, ...) may be imported where they are used.
"""
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "grpo_ablate"
# cli/app.py loads a command's modules when it runs; the sweep launcher imports the training stack
# (torch, transformers: ~4 s) only when runs start, so planning and every refusal before it are fast;
# the sweep command (sweep/command.py, cli/app.py's `sweep` moved there) imports sequential.py and the
# report's curves (pandas, scipy) only for a sweep that needs them, as cli/app.py did; the report package
# loads its API on first use, so a sweep that reads report/schema.py does not import pandas and scipy;
# `grpo-ablate eval` (rescore/command.py) plans every run before it imports the training stack to score them.
LAZY_ALLOWED = {"grpo_ablate.cli.app", "grpo_ablate.sweep.launch", "grpo_ablate.sweep.command", "grpo_ablate.report",
                "grpo_ablate.rescore.command"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, known: set[str]):
    """(imported grpo_ablate module, inside a function?) for every import in the file."""
    tree = ast.parse(path.read_text())
    inside = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from a.b import c`: c itself when it is a module, else a.b
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "grpo_ablate":
                yield name, id(node) in inside


def graph() -> tuple[dict[str, set[str]], list[str]]:
    known = set(modules())
    edges, lazy = {}, []
    for name, path in modules().items():
        edges[name] = set()
        for target, in_function in imports(path, known):
            while target not in known:           # an attribute imported from a package
                target = target.rsplit(".", 1)[0]
            if target != name:
                edges[name].add(target)
            if in_function and name not in LAZY_ALLOWED:
                lazy.append(f"{name} imports {target} inside a function")
    return edges, lazy


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle_among_grpo_ablate_modules():
    edges, _ = graph()
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_imports_inside_functions_only_in_the_cli():
    _, lazy = graph()
    assert not lazy, "; ".join(lazy)


def test_tricks_import_only_torch():
    allowed = {"torch", "grpo_ablate"} | set(sys.stdlib_module_names)
    for path in (PACKAGE / "tricks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                assert root in allowed, f"{path.name} imports {name}"
                if root == "grpo_ablate":
                    # grpo_ablate.allowed: the one allowed-value type, a stdlib-only leaf the CLI shares
                    assert name.startswith("grpo_ablate.tricks") or name == "grpo_ablate.allowed", \
                        f"{path.name} imports {name}"


def test_the_validation_layer_does_not_reach_into_training():
    """config/validate.py, inert.py and pair_rules.py check a config before any run: they import
    nothing of grpo_ablate.train."""
    edges, _ = graph()
    for name in ("grpo_ablate.config.validate", "grpo_ablate.config.inert", "grpo_ablate.config.pair_rules"):
        assert not {t for t in edges[name] if t.startswith("grpo_ablate.train")}, f"{name}: {sorted(edges[name])}"


def private_uses(path: Path, known: set[str]):
    """`from grpo_ablate.x import _name` and `module._name` for a grpo_ablate module bound by an import."""
    tree = ast.parse(path.read_text())
    modules_bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("grpo_ablate"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    modules_bound[alias.asname or alias.name] = full
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("grpo_ablate") and alias.asname:
                    modules_bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules_bound
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            yield f"{modules_bound[node.value.id]}.{node.attr}"


def test_no_module_uses_another_modules_private_names():
    """A name starting with _ is the module's own: what other modules need is public (e.g. the
    sweep package's launch.run_jobs, check_launcher, console.cpus, manifest.timestamp; doctor.stage_request)."""
    known = set(modules())
    found = [f"{name} uses {use}" for name, path in modules().items() for use in private_uses(path, known)
             if not use.startswith(name + ".")]
    assert not found, "; ".join(found)


def test_the_private_name_detector_finds_one(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from grpo_ablate.sweep import launch\n"
                      "from grpo_ablate.config.validate import _require\nlaunch._x()\n")
    assert sorted(private_uses(source, {"grpo_ablate.sweep.launch"})) == ["grpo_ablate.config.validate._require",
                                                                          "grpo_ablate.sweep.launch._x"]


def room(module: str) -> str:
    """The package (or top-level module) a module lives in: grpo_ablate.config.spec -> config."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_packages_import_one_way():
    """Between packages, imports run one way (cli -> sweep -> train -> config -> tricks, ...): a
    package that imports another is never imported by it, also not through a third."""
    edges, _ = graph()
    rooms: dict[str, set[str]] = {}
    for name, targets in edges.items():
        rooms.setdefault(room(name), set()).update(room(t) for t in targets if room(t) != room(name))
    cycle = find_cycle(rooms)
    assert cycle is None, "packages that import each other: " + " -> ".join(cycle)


def test_the_top_level_holds_only_what_belongs_to_no_layer():
    """The command line (cli/), configuration (config/) and the run dir's life (rundir/) are packages;
    the top level keeps the few modules every layer shares (errors, allowed values, the design model)."""
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 10, top


def test_the_detector_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_trick_modules_take_torch_on_first_use():
    """Checking a config imports every trick module; `import torch` there would cost every refusal
    ~2 s (tricks/torch_on_first_use.py). Only that module imports torch itself."""
    for path in (PACKAGE / "tricks").rglob("*.py"):
        if path.name == "torch_on_first_use.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            assert not any(n == "torch" or n.startswith("torch.") for n in names), \
                f"{path.name} imports torch: use `from grpo_ablate.tricks.torch_on_first_use import torch`"


STATEFUL = ("pool", "replay", "stale", "ref_sync", "reference_sync", "snapshot", "previous", "history_depth",
            "two_layer", "Pool", "Replay", "Stale", "ReferenceSync", "PreviousPolicy")


def test_the_trainer_names_no_stateful_trick():
    """Tricks with state of their own are plugins (train/state/): `GRPOTrainer` loops over the
    active ones and names none of them, neither by a name in its code nor by a family's string."""
    tree = ast.parse((PACKAGE / "train" / "step.py").read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GRPOTrainer")
    docstrings = {id(f.body[0].value) for f in ast.walk(trainer)
                  if isinstance(f, (ast.FunctionDef, ast.ClassDef)) and f.body and isinstance(f.body[0], ast.Expr)}
    named = [n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else n.value
             for n in ast.walk(trainer)
             if isinstance(n, (ast.Name, ast.Attribute)) or isinstance(n, ast.Constant) and isinstance(n.value, str)
             and id(n) not in docstrings]
    found = sorted({name for name in named if any(word in name for word in STATEFUL)})
    assert not found, f"GRPOTrainer names stateful tricks: {found}"


def test_the_stateful_trick_detector_finds_one(tmp_path):
    """(the test above would find a trainer that asks for a replay buffer by name)"""
    code = "class GRPOTrainer:\n    def f(self):\n        return self.replay, option('prompt_pool', 'x')\n"
    tree = ast.parse(code)
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert {"replay", "prompt_pool"} <= names and any(w in "replay" for w in STATEFUL)


def test_the_room_size_report_finds_a_long_function_and_a_long_module(tmp_path):
    """Room sizes are a printed report (scripts/room_sizes.py, `make lint`), not a gate: a gate made
    files stop at 499 lines and functions at 60. Its finder still has to find what it reports."""
    sys.path.insert(0, str(PACKAGE.parent / "scripts"))
    try:
        from room_sizes import past_the_guides
    finally:
        sys.path.pop(0)
    long = tmp_path / "m.py"
    long.write_text("def f():\n" + "    x = 1\n" * 60 + "y = 2\n" * 440)
    assert past_the_guides([long]) == ["m.py: 501 lines", "m.py:1 f: 61 lines"]


def test_every_user_error_is_a_user_error():
    """One base class for bad input (errors.UserError): the CLI catches it in one place, and an
    error class of its own elsewhere would turn a user's mistake into a traceback."""
    import importlib

    from grpo_ablate.errors import UserError

    found = [(module_name(path), node.name) for path in PACKAGE.rglob("*.py")
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ClassDef) and (node.name.endswith("Error") or node.name == "ValueProblem")]
    assert len(found) >= 5, found          # errors.py's, SweepError, ModelPathError, ValueProblem
    not_user = [f"{m}.{name}" for m, name in found
                if not issubclass(getattr(importlib.import_module(m), name), UserError)]
    assert not not_user, not_user


# The run's runtime: what train() builds and steps. The config is composed, validated and checked
# above it (config/: compose.py, validate.py, inert.py, resume_rules.py, here.py; sweep planning: the
# config layer) and turned into the frozen RunSpec (config/spec.py) on train()'s first screen; below that every part
# receives its own piece of the spec (a family's BoundOption, the rollout settings, ...).
RUNTIME = ("train", "sampling", "tasks", "evals", "rescore", "models.py", "rundir")
# The functions of the runtime that take the composed DictConfig (or a group of it), each with why.
TAKES_A_CONFIG = {
    "grpo_ablate.train.grpo:train": "the entry: validates and checks the config, makes the run spec (first screen)",
    "grpo_ablate.train.entrypoint:hydra_train": "Hydra's entry: hands the composed config to train() or run_control()",
    "grpo_ablate.train.controls:run_control": "the control runs' entry: the same first screen as train()",
    "grpo_ablate.train.run_log:WandbSink.__init__": "W&B's run config is the composed config (RunRecord.config)",
    "grpo_ablate.train.run_log:wandb_config": "the composed config as W&B's run config, sweep flags added",
    # the model group (RunSpec.model.group, read-only): the config layer and the sweep's warm-up
    # (sweep/launch.py, config/here.py, the tests' fixtures) call these loaders with cfg.model as well
    "grpo_ablate.models:ensure_warm_started": "the model group: the sweep warms the model up before its runs",
    "grpo_ablate.models:model_dir": "the model group: the sweep converts a GGUF model before its runs",
    "grpo_ablate.models:model_device": "the model group: read on train()'s first screen",
    "grpo_ablate.models:add_lora": "the model group's lora settings, passed to peft as they are",
}
# `grpo-ablate eval` (rescore/command.py) is an entry like train(): it composes a finished run's config with
# the protocol asked for, validates it and makes the run spec; what scores below it gets the spec
EVAL_ENTRY = "grpo_ablate.rescore.command"


def config_parameters(path: Path, module: str) -> list[str]:
    """'module:Class.function' for every function with a parameter named `cfg` (or `*_cfg`) or
    annotated DictConfig."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
                if any(p.arg == "cfg" or p.arg.endswith("_cfg")
                       or p.annotation is not None and "DictConfig" in ast.unparse(p.annotation) for p in params):
                    found.append(f"{module}:{prefix}{child.name}")
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text()), "")
    return found


def runtime_modules() -> dict[str, Path]:
    return {name: path for name, path in modules().items()
            if any(path.relative_to(PACKAGE).parts[0] == part for part in RUNTIME)}


def test_nothing_below_trains_first_screen_receives_the_config():
    """The DictConfig stops at train()'s first screen. A component that reads the
    config (`cfg.rollout.x`, a trick bound from `cfg`) gets its part of the RunSpec instead."""
    found = [f for name, path in runtime_modules().items() for f in config_parameters(path, name)]
    assert sorted(set(found) - set(TAKES_A_CONFIG)) == [], "take the run spec's part, not the config"
    assert sorted(set(TAKES_A_CONFIG) - set(found)) == [], "an allowed function that no longer takes it"


def test_the_runtime_reaches_the_config_layer_only_from_the_entries():
    """Only the entries (train(), run_control()) import the config layer: nothing below binds a
    trick from the config again (the spec's BoundOption is the one binding)."""
    edges, _ = graph()
    layer = {f"grpo_ablate.config.{name}" for name in ("compose", "validate", "inert", "pair_rules", "resume_rules",
                                                      "here")}
    entries = {key.split(":")[0] for key in TAKES_A_CONFIG
               if key.endswith((":train", ":run_control", ":hydra_train"))} | {EVAL_ENTRY}
    found = {name: sorted(edges[name] & layer) for name in runtime_modules() if edges[name] & layer}
    assert set(found) <= entries, found


def test_the_config_parameter_detector_finds_one(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from omegaconf import DictConfig\n\n"
                      "def sample(rollouts, cfg, step): ...\n\n"
                      "def load(*, run_cfg=None): ...\n\n"
                      "class Trainer:\n    def __init__(self, config: 'DictConfig | None'): ...\n\n"
                      "    def step(self, spec, rollout_settings): ...\n")
    assert config_parameters(source, "m") == ["m:sample", "m:load", "m:Trainer.__init__"]
