"""Shared fixtures: a small, fast model config and an isolated cache, W&B offline.

The tests train for real, but on a smaller warm-started model than the embedded default
(same code path, a different content-addressed cache entry) so the suite stays in budget.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

# Everything a test run needs to stay offline and out of the user's home directory; set before
# transformers and huggingface_hub are imported (they read it at import).
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.pop("WANDB_API_KEY", None)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# `make test` runs two pytest-xdist workers on two cores: one torch thread each (and in the
# processes they start), else OpenMP threads spin-wait on each other's cores, several times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from filelock import FileLock  # noqa: E402

from grpo_ablate.config.compose import compose  # noqa: E402
from grpo_ablate.models import ensure_warm_started  # noqa: E402
from grpo_ablate.tasks import build_task  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


# The fast tier (`make test`) holds the tests that need no trained model. A test that warm-starts,
# trains or loads one asks for the model cache or the tiny checkpoints, directly or through a fixture,
# and is in the full tier (`make test-full`), unless marked `fast`: the few real runs that keep the
# fast tier end to end. Tests that need neither but take seconds are marked `full` where they are.
MODEL_FIXTURES = {"cache_dir", "tiny_models"}


@pytest.hookimpl(tryfirst=True)   # before `-m` selects by the markers
def pytest_collection_modifyitems(config, items):
    """A test that needs a model is in the full tier unless marked `fast`; `gpu` tests skip, with the
    reason, where no CUDA GPU is available."""
    import torch

    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("fast") is None:
            item.add_marker(pytest.mark.full)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here); scripts/gpu_check.sh runs them on one")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

SMALL = [
    "model.arch.hidden_size=32", "model.arch.intermediate_size=64",
    "model.arch.num_hidden_layers=2", "model.arch.num_attention_heads=2",
    "model.arch.num_key_value_heads=1", "model.warmup.steps=300", "model.warmup.batch_size=32",
    "model.warmup.slip_prob=0.0", "task.operand_max=9",   # one-digit sums: rewards vary at once
    "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16",
    "task.eval_size=16", "eval.every=2", "checkpoint_every=2", "samples_every=2",
    "steps=4", "logger=none", "threads=1",
    "optim.lr=1.0e-4",   # the embedded default's lr before its calibration: golden metrics stay as recorded
    "optim.schedule=constant",   # and its schedule before the default's lr decayed linearly
    "eval=greedy",               # and its eval before the default drew 8 samples per problem
]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One model cache for the session, shared by pytest-xdist's workers (`make test` runs two):
    the small test model is warm-started once, by the first worker to get here, while the
    others wait on a lock; an embedded default a test needs is built once the same way."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                     # the workers' basetemps share this parent
    path = root / "model-cache"
    if os.environ.get("GRPO_ABLATE_TEST_CACHE"):   # opt-in: keep warm starts between local sessions
        root = path = Path(os.environ["GRPO_ABLATE_TEST_CACHE"]).expanduser()   # (content-addressed: safe)
    os.environ["GRPO_ABLATE_CACHE"] = str(path)
    os.environ["WANDB_CACHE_DIR"] = str(tmp_path_factory.mktemp("wandb_cache"))
    os.environ["WANDB_CONFIG_DIR"] = str(tmp_path_factory.mktemp("wandb_config"))
    with FileLock(str(root / "model-cache.lock")):
        path.mkdir(exist_ok=True)
        if os.environ.get("GRPO_ABLATE_RECORD_GOLDEN") != "1":   # recording computes it on this CPU
            seed_recorded_warm_start(path)
        cfg = compose(SMALL + [f"model.cache_dir={path}"])
        ensure_warm_started(cfg.model, build_task(cfg.task), log=lambda *_: None)
    return path


RECORDED_WARM_START = REPO / "tests" / "golden" / "warm_start"


def seed_recorded_warm_start(cache: Path) -> None:
    """Put the recorded warm start of the small model (tests/golden/warm_start/, 100 KB) into the
    cache, so a session does not spend its first ~20 s on 300 supervised steps, and every CPU trains
    from the same weights (the warm start's AdamW steps amplify a reordering of float32 sums; the
    GRPO runs from equal weights stay within the golden tests' bound). Copied then renamed: a
    worker never sees half an entry. tests/test_golden.py checks the recording is what this code
    computes."""
    for stored in RECORDED_WARM_START.iterdir():
        if not (cache / stored.name / "config.json").exists():
            tmp = cache / f".{stored.name}-seeding"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(stored, tmp)
            os.rename(tmp, cache / stored.name)


@pytest.fixture(scope="session")
def default_model(cache_dir):
    """The embedded default's warm start (what `grpo-ablate train` trains), built once."""
    with FileLock(str(cache_dir) + ".default.lock"):
        cfg = compose([f"model.cache_dir={cache_dir}"])
        return ensure_warm_started(cfg.model, build_task(cfg.task), log=lambda *_: None)


@pytest.fixture
def small(cache_dir):
    """Overrides for a fast real run on the small model."""
    return list(SMALL) + [f"model.cache_dir={cache_dir}"]


def cli(*args, cwd=None, timeout=300, env=None):
    """Run `grpo-ablate ...` in a subprocess, as a user would (env values of None are unset)."""
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.run([sys.executable, "-m", "grpo_ablate.cli", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def refused_train(overrides: str, needle: str, cwd) -> None:
    """`grpo-ablate train <overrides>` as a user meets a bad value: exit 2, one `error:` line that
    names `needle`, no traceback, and nothing written into `cwd` (an empty dir). In this process
    (`cli_here`): the refusal is the same code either way, and a fresh process's 3-4 s of imports
    would be most of the check; tests/test_cli.py proves the real process's one line."""
    out = cli_here("train", *overrides.split(), cwd=cwd)
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit), (out.stderr, out.exception)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], out.stderr
    assert not any(Path(cwd).iterdir())


def cli_here(*args, cwd):
    """`grpo-ablate ...` in this process through typer's runner, from `cwd`: the same code as
    `cli`, without a process's 3-4 s of imports (for checks that refuse or plan; runs that
    train use `cli`). The result has exit_code, stdout and stderr."""
    from typer.testing import CliRunner

    from grpo_ablate.cli.app import app

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, [str(a) for a in args])
    finally:
        os.chdir(old)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Tiny random Llama, Qwen2 (with a chat template) and GPT-2 checkpoints: arch -> dir."""
    from tiny_models import save_tiny_models

    return save_tiny_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def slurm_cluster():
    """A live one-node SLURM cluster with partition `debug` (scripts/slurm.sh up: installs
    slurm-wlm and munge where they are missing and this machine allows it, i.e. root and
    apt-get). Where the cluster cannot run here, the tests that use it skip with the script's
    reason; where it should run but does not answer, they fail with its logs. A cluster this
    fixture started is stopped at the end of the session; one that was already up stays up."""
    script = REPO / "scripts" / "slurm.sh"
    if shutil.which("bash") is None:
        pytest.skip("no SLURM cluster: scripts/slurm.sh needs bash")
    was_up = subprocess.run(["bash", str(script), "status"], capture_output=True).returncode == 0
    up = subprocess.run(["bash", str(script), "up"], capture_output=True, text=True, timeout=900)
    said = (up.stdout + up.stderr).strip()
    if up.returncode == 3:
        pytest.skip(f"no SLURM cluster: {said.splitlines()[-1]}")
    if up.returncode != 0:
        pytest.fail(f"scripts/slurm.sh up failed (exit {up.returncode}):\n{said}", pytrace=False)
    yield "debug"
    if not was_up:
        subprocess.run(["bash", str(script), "down"], capture_output=True, timeout=120)


@pytest.fixture
def hydra_fallbacks(monkeypatch):
    """The overrides Hydra itself composed (config/composition.py returned None for them), from an empty cache."""
    from grpo_ablate.config import compose

    fallbacks, hydra_composed = [], compose._hydra_composed
    compose._composed.cache_clear()
    monkeypatch.setattr(compose, "_hydra_composed", lambda overrides: fallbacks.append(list(overrides))
                        or hydra_composed(overrides))
    return fallbacks
