"""Adding an option and a family, done for real on a copy of the package: a new option with a function
is 1 file written by hand (its function with its facts; its reference test aside) and a new family 1
(its module) plus its call site in the loss or reward chain; `make catalogue` writes everything else,
the options' conf files included. The family trains through its call site, and before the call site
is there a real run lists it as read by nothing (tests/family_reads.py).

The copy is laid out as a wheel is (conf/ inside the package as grpo_ablate/conf), and every command
runs on it in a fresh process, so the test sees exactly the files a contributor would touch.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

OPTION = '''"""A throwaway policy loss (tests/test_throwaway.py)."""
from grpo_ablate.tricks.conditions import one_optimizer_step
from grpo_ablate.tricks.registry import POSITIVE, Activity, Inert, Allowed, Trick, register
from grpo_ablate.tricks.torch_on_first_use import torch


@register("clip", "throwaway", knobs={"eps": POSITIVE, "tau": Allowed(low=0, high=2)},
          activity=Activity("clip/throwaway_frac"),
          inert=Inert(one_optimizer_step, "cannot act with one optimizer step per rollout", "add updates.multi",
                      "several optimizer steps per rollout"),
          tricks=(Trick("throwaway_trick", what="a throwaway policy loss", source="tests/test_throwaway.py",
                        verdict="not_in_review", settings={"tau": 1.5}),))
def throwaway_loss(logp, old_logp, advantages, mask, *, eps: float = 0.1, tau: float = 1.0):
    """A throwaway policy loss: the ratio times tau."""
    ratio = torch.exp(logp - old_logp)
    return -advantages * ratio * tau, {"clip/throwaway_frac": ((ratio - 1).abs() > eps).float().mean()}
'''

FAMILY = '''"""A throwaway reward-shaping family (tests/test_throwaway.py)."""
from grpo_ablate.tricks.registry import NUMBER, Activity, Trick, declare_family, register

declare_family("throwaway_family", "a throwaway reward term", stage="reward", metric="reward/mean", neutral="none")


@register("throwaway_family", "none")
def no_bonus(rewards):
    return rewards


@register("throwaway_family", "bonus", knobs={"size": NUMBER}, activity=Activity("reward/mean", kind="changes"),
          tricks=(Trick("throwaway_bonus", what="a constant added to every reward", source="tests/test_throwaway.py",
                        verdict="not_in_review"),))
def constant_bonus(rewards, *, size: float = 0.5):
    """A constant added to every reward."""
    return rewards + size
'''

@pytest.fixture
def package_copy(tmp_path):
    """The package with its conf (the link grpo_ablate/conf followed) and docs, copied; (root, run(*argv))."""
    root = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "grpo_ablate", root / "grpo_ablate", ignore=ignore)   # grpo_ablate/conf -> ../conf: copied
    shutil.copytree(REPO / "docs", root / "docs", ignore=ignore)
    env = {**os.environ, "PYTHONPATH": str(root), "WANDB_MODE": "disabled"}

    def run(*argv, check=True):
        done = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0 or not check, done.stderr[-3000:]
        return done

    where = run("-c", "import grpo_ablate.conf as c, grpo_ablate as g; print(g.__file__, c.__file__)").stdout
    assert where.count(str(root)) == 2, where   # the copy is what runs, not the checkout
    return root, run


def snapshot(root) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def touched(before: dict, after: dict) -> set:
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}


def test_a_new_option_is_one_file_by_hand_and_make_catalogue(package_copy, tmp_path, small):
    root, run = package_copy
    before = snapshot(root)
    (root / "grpo_ablate" / "tricks" / "throwaway.py").write_text(OPTION)                 # by hand: 1
    run("-m", "grpo_ablate.config.catalogue", "--write")                                          # make catalogue
    assert touched(before, snapshot(root)) == {
        "grpo_ablate/tricks/throwaway.py",
        # what `make catalogue` wrote: the option's config, the trick's file, its rows in the docs
        "grpo_ablate/conf/clip/throwaway.yaml", "grpo_ablate/conf/trick/throwaway_trick.yaml", "docs/tricks.md",
        "docs/config.md"}
    assert (root / "grpo_ablate" / "conf" / "clip" / "throwaway.yaml").read_text().splitlines()[2:] == [
        "name: throwaway", "eps: 0.1", "tau: 1.0"]   # the signature's defaults
    # it trains, through the named trick the catalogue wrote, and its activity metric is logged
    run("-m", "grpo_ablate.cli", "train", *small, "+trick=throwaway_trick", "updates=multi", "steps=1",
        "logger=none", "eval.every=1", f"hydra.run.dir={tmp_path / 'run'}")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert "clip/throwaway_frac" in rows[-1] and rows[-1]["step"] == 1
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "name: throwaway" in config and "tau: 1.5" in config   # the trick's own setting
    # checked from its registration: a bad knob is one line, exit 2
    bad = run("-m", "grpo_ablate.cli", "train", "+trick=throwaway_trick", "clip.tau=3", check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: clip.tau=3 is not allowed; it must be a number in [0, 2]"]
    listed = json.loads(run("-m", "grpo_ablate.cli", "tricks", "--format", "json").stdout)
    assert {"name": "throwaway_trick", "family": "clip", "option": "throwaway"}.items() <= \
        next(r for r in listed if r["name"] == "throwaway_trick").items()


# The call site of a reward-stage family: train/rewards.py's RewardShaping, where overlong and length
# shape the rewards the advantage sees (a loss-stage family's would be train/losses.py's LossTerms).
CALL_SITE = (('self.overlong, self.length = tricks["overlong"]',
              'self.throwaway_family = tricks["throwaway_family"].fn'),
             ("rewards, length_reward = self.length(", "rewards = self.throwaway_family(rewards)"))


def add_call_site(root):
    """Each line of CALL_SITE after the one line of train/rewards.py that holds its anchor."""
    rewards = root / "grpo_ablate" / "train" / "rewards.py"
    lines = rewards.read_text().splitlines(keepends=True)
    for anchor, added in CALL_SITE:
        (at,) = [n for n, line in enumerate(lines) if anchor in line]   # train/rewards.py changed: update CALL_SITE
        lines.insert(at + 1, lines[at][:len(lines[at]) - len(lines[at].lstrip())] + added + "\n")
    rewards.write_text("".join(lines))


def trained(run, root, tmp_path, small, name) -> tuple[list, dict]:
    """A 1-step run with the bonus on: the families nothing looked up, and its metrics."""
    overrides = [*small, "throwaway_family=bonus", "steps=1", "eval.every=1"]
    unread = run(str(REPO / "tests" / "family_reads.py"), json.dumps(overrides), str(tmp_path / name)).stdout
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return json.loads(unread.splitlines()[-1]), rows[-1]


def test_a_new_family_is_one_file_by_hand_its_call_site_and_make_catalogue(package_copy, tmp_path, small):
    root, run = package_copy
    before, recorded = snapshot(root), hashes(run)
    (root / "grpo_ablate" / "tricks" / "throwaway_family.py").write_text(FAMILY)           # by hand: 1
    run("-m", "grpo_ablate.config.catalogue", "--write")
    assert hashes(run) == recorded   # at its neutral option every run hashes (and resumes) as before it
    # without a call site the family composes, validates and trains, as a no-op: nothing reads it
    unread, without = trained(run, root, tmp_path, small, "no_call_site")
    assert unread == ["throwaway_family"]
    add_call_site(root)                                                                    # by hand: its call site
    unread, with_it = trained(run, root, tmp_path, small, "call_site")
    assert unread == [] and with_it["step"] == without["step"] == 1
    # its activity metric: the same completions (same seed), every reward up by the bonus
    assert with_it["reward/mean"] == pytest.approx(without["reward/mean"] + 0.5)
    assert with_it["train/accuracy"] == without["train/accuracy"]
    assert touched(before, snapshot(root)) == {
        "grpo_ablate/tricks/throwaway_family.py", "grpo_ablate/train/rewards.py",
        # what `make catalogue` wrote: its options' configs, the trick's file, the docs, and the family's line
        # in every run's defaults list
        "grpo_ablate/conf/throwaway_family/none.yaml", "grpo_ablate/conf/throwaway_family/bonus.yaml",
        "grpo_ablate/conf/trick/throwaway_bonus.yaml", "docs/tricks.md", "docs/config.md",
        "grpo_ablate/conf/config.yaml"}
    # in every run's config, among the reward stage's families (before the batch stage's); checked
    probe = ("from grpo_ablate.config.compose import compose\nfrom grpo_ablate.config.validate import validate\n"
             "cfg = compose(['+trick=throwaway_bonus']); validate(cfg); print(cfg.throwaway_family.size)\n"
             "keys = list(compose([]).keys()); print(compose([]).throwaway_family.name, keys.index('reward_norm')\n"
             "      < keys.index('throwaway_family') < keys.index('prompt_pool'))")
    assert run("-c", probe).stdout.split() == ["0.5", "none", "True"]
    bad = run("-m", "grpo_ablate.cli", "train", "throwaway_family=bonus", "throwaway_family.size=x", check=False)
    assert bad.returncode == 2 and "throwaway_family.size" in bad.stderr and "Traceback" not in bad.stderr
    table = (root / "docs" / "config.md").read_text()
    assert "| `throwaway_family` | `none`, `bonus` | a throwaway reward term" in table


# A run setting added by hand: its declaration (one line in config/run_settings.py) and its reader.
SETTING = ('    "optim.warmup_steps": Setting(',
           '    "optim.eps": Setting(1.0e-8, POSITIVE.but(neutral=1.0e-8), "AdamW\'s epsilon"),\n')
READER = ("weight_decay=optim.weight_decay)", "weight_decay=optim.weight_decay, eps=optim.eps)")
HASHED = ["default", "optim.lr=1e-3", "preset=dapo", "+trick=vapo_gae", "eval=greedy"]


def hashes(run) -> list[str]:
    probe = ("import json, sys\nfrom grpo_ablate.config.compose import compose\n"
             "from grpo_ablate.config.identity import config_hash\n"
             "cases = json.loads(sys.argv[1])\n"
             "print(json.dumps([config_hash(compose([] if c == 'default' else [c])) for c in cases]))")
    return json.loads(run("-c", probe, json.dumps(HASHED)).stdout)


def test_a_new_run_setting_is_its_declaration_and_its_reader(package_copy, tmp_path, small):
    """A setting of the run's own (`optim.eps`) is 2 files by hand, its declaration and its reader; `make
    catalogue` writes its default into conf/config.yaml and its row into docs/config.md; the run spec
    has it from the declaration. Declared with its neutral value, it moves no recorded hash, and a run
    recorded before it resumes to the metrics of a run made after it, bit for bit."""
    root, run = package_copy
    args = [*small, "optim.schedule=constant", "eval.every=2", "checkpoint_every=2", "samples_every=2"]
    run("-m", "grpo_ablate.cli", "train", *args, "steps=2", f"hydra.run.dir={tmp_path / 'before'}")
    recorded, before = hashes(run), snapshot(root)
    settings = root / "grpo_ablate" / "config" / "run_settings.py"
    lines = settings.read_text().splitlines(keepends=True)
    (at,) = [n for n, line in enumerate(lines) if line.startswith(SETTING[0])]   # else run_settings.py changed
    settings.write_text("".join(lines[:at] + [SETTING[1]] + lines[at:]))                   # by hand: 1
    optimizer = root / "grpo_ablate" / "train" / "run.py"
    assert optimizer.read_text().count(READER[0]) == 1                                     # train/run.py changed
    optimizer.write_text(optimizer.read_text().replace(*READER))                           # by hand: 2
    run("-m", "grpo_ablate.config.catalogue", "--write")                                   # make catalogue
    assert touched(before, snapshot(root)) == {
        "grpo_ablate/config/run_settings.py", "grpo_ablate/train/run.py",
        "grpo_ablate/conf/config.yaml", "docs/config.md"}                                  # the last two generated
    written = (root / "grpo_ablate" / "conf" / "config.yaml").read_text().splitlines()
    assert ["eps:", "1.0e-8", "#", "AdamW's", "epsilon"] in [line.split() for line in written]
    assert hashes(run) == recorded
    resumed = run("-m", "grpo_ablate.cli", "train", "--resume", str(tmp_path / "before"), "steps=4")
    assert "resuming" in resumed.stdout
    run("-m", "grpo_ablate.cli", "train", *args, "steps=4", f"hydra.run.dir={tmp_path / 'after'}")
    rows = {name: [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
                   for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("before", "after")}
    assert [r["step"] for r in rows["after"]] == [0, 1, 2, 3, 4] and rows["before"] == rows["after"]
    bad = run("-m", "grpo_ablate.cli", "train", "optim.eps=0", check=False)   # checked from its declaration
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: optim.eps=0 is not allowed; it must be a number > 0"]


# A sweep mode with an option of its own, added by hand: its function (sweep/modes.py) and its option
# (sweep/requests.py, on SweepArgs after --determinism).
MODE = '''

@sweep_mode("head-to-head", options={"champion": "--champion belongs to `sweep head-to-head`"})
def head_to_head(tricks, families, champion=None, **_):
    """Each trick alone against the --champion alone."""
    if champion not in tricks:
        raise SweepError(f"--champion {champion} is not among --tricks {', '.join(tricks)}")
    variants = [_variant(f"alone-{t}", [t], None if t == champion else f"alone-{champion}") for t in tricks]
    return Matrix("head-to-head", variants, [Contrast(t, f"alone-{t}", f"alone-{champion}")
                                             for t in tricks if t != champion])
'''
MODE_OPTION = ('"metric and step that differ.", default=False)\n',
               '    champion: str | None = option("--champion", help="head-to-head: the trick the others are measured '
               'against.", allowed=TEXT)\n')


def test_a_new_sweep_mode_with_its_own_option_is_two_files(package_copy, tmp_path):
    """A sweep mode is one registered function, and an option of its own one field of SweepArgs; nothing
    else names it: the command line lists it, plans it, hands it its option and refuses the option
    elsewhere."""
    root, run = package_copy
    before = snapshot(root)
    modes = root / "grpo_ablate" / "sweep" / "modes.py"
    text = modes.read_text()
    at = text.index("\n\n# the modes the command line names")   # sweep/modes.py changed: update the anchor
    modes.write_text(text[:at] + "\n" + MODE + text[at:])                                  # by hand: 1
    requests = root / "grpo_ablate" / "sweep" / "requests.py"
    assert requests.read_text().count(MODE_OPTION[0]) == 1                              # else requests.py changed
    requests.write_text(requests.read_text().replace(MODE_OPTION[0], MODE_OPTION[0] + MODE_OPTION[1]))   # by hand: 2
    assert touched(before, snapshot(root)) == {"grpo_ablate/sweep/modes.py", "grpo_ablate/sweep/requests.py"}
    planned = run("-m", "grpo_ablate.cli", "sweep", "head-to-head", "--tricks", "length_group,token_mean,no_std",
                  "--champion", "no_std", "--seeds", "2", "--dry-run", "--no-controls")
    assert "3 variants x 2 seeds" in planned.stdout, planned.stdout
    assert "alone-length_group" in planned.stdout and "alone-no_std" in planned.stdout
    elsewhere = run("-m", "grpo_ablate.cli", "sweep", "leave-one-out", "--tricks", "no_std", "--champion", "no_std",
                    "--dry-run", check=False)
    assert elsewhere.returncode == 2 and elsewhere.stderr.strip().splitlines() == [
        "error: --champion belongs to `sweep head-to-head`"]
    listed = run("-m", "grpo_ablate.cli", "sweep", "--help").stdout
    assert "head-to-head" in listed and "--champion" in listed


STATEFUL_OPTION = '''"""A throwaway stateful option (tests/test_throwaway.py): AdamW as it is, counting its steps."""
from grpo_ablate.tricks.registry import Activity, register


@register("optim_state", "throwaway_count", counts_optimizer_steps=True, activity=Activity("optim/throwaway_steps"),
          writes=("optim/throwaway_steps",))
def keep_and_count(optimizer) -> None:
    """AdamW's moments carried across the run; the option's state (train/state/optim_state.py) counts."""
'''

STATE = '''

class ThrowawayCount(Plugin):
    key = "throwaway_count"

    def __init__(self):
        self.steps = 0

    def after_optimizer_step(self, optimizer) -> None:
        self.steps += 1

    def metrics(self, batch) -> dict:
        return {"optim/throwaway_steps": self.steps}

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])


@stateful("optim_state")
def throwaway_count(spec: RunSpec, task, policies) -> ThrowawayCount | None:
    return ThrowawayCount() if spec.tricks["optim_state"].option.counts_optimizer_steps else None
'''


def test_a_new_stateful_option_is_its_module_and_its_familys_state_and_it_trains(package_copy, tmp_path, small):
    """A stateful option: its function with its facts (tricks/), its state beside its family's
    (train/state/<family>.py, found by @stateful: no list, no trainer file), `make catalogue`; one
    step on the small model logs the state's metric and checkpoints it under its key."""
    root, run = package_copy
    package = root / "grpo_ablate"
    before = snapshot(root)
    (package / "tricks" / "throwaway_state.py").write_text(STATEFUL_OPTION)               # by hand: 1
    state = package / "train" / "state" / "optim_state.py"
    state.write_text(state.read_text() + STATE)                                           # by hand: 2
    hand = {"grpo_ablate/tricks/throwaway_state.py", "grpo_ablate/train/state/optim_state.py"}
    run("-m", "grpo_ablate.config.catalogue", "--write")                                          # make catalogue
    generated = touched(before, snapshot(root)) - hand
    assert "grpo_ablate/conf/optim_state/throwaway_count.yaml" in generated   # its config node, from the registry
    assert touched(before, snapshot(root)) - generated == hand
    assert not {p for p in generated if p.endswith(".py")}, generated   # no code generated
    run("-m", "grpo_ablate.cli", "train", *small, "optim_state=throwaway_count", "steps=1", "logger=none",
        "eval.every=1", f"hydra.run.dir={tmp_path / 'run'}")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and rows[-1]["optim/throwaway_steps"] == 1
    saved = run("-c", "import sys, torch; print(torch.load(sys.argv[1], weights_only=False)['throwaway_count'])",
                str(tmp_path / "run" / "checkpoint" / "trainer_state.pt")).stdout
    assert saved.strip() == "{'steps': 1}"
