"""Named tricks (`+trick=<name>`, conf/trick/): each sets one family, conflicts are errors."""
from pathlib import Path

import pytest
import yaml

from conftest import REPO, cli
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.report.activity import activity_of, shows_activity
from grpo_ablate.tricks.registry import all_options
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.train.grpo import train

TRICK_FILES = sorted((REPO / "conf" / "trick").glob("*.yaml"))
TRICKS = [p.stem for p in TRICK_FILES]


REGISTERED = {t.name: (o, t) for o in all_options() for t in o.tricks}


@pytest.mark.parametrize("path", TRICK_FILES, ids=TRICKS)
def test_trick_file_selects_the_option_it_is_registered_with(path: Path):
    """conf/trick/<name>.yaml overrides one family and records only {family, option}; the
    trick's text (what, source, verdict, cost) is registered with that option."""
    text = path.read_text()
    assert text.startswith("# @package _global_")
    data = yaml.safe_load(text)
    (override,) = data["defaults"]
    (key, option), = override.items()
    info = data["tricks"][path.stem]
    assert set(info) == {"family", "option"}, "the catalogue text belongs in the registration, not the trick file"
    assert key == f"override /{info['family']}" and option == info["option"]
    assert (REPO / "conf" / info["family"] / f"{option}.yaml").exists()
    registered, trick = REGISTERED[path.stem]
    assert (registered.family, registered.name) == (info["family"], info["option"])
    assert trick.verdict and trick.source and trick.what


def test_every_registered_trick_has_its_file():
    assert sorted(REGISTERED) == TRICKS


@pytest.fixture(scope="module")
def tiny_default(cache_dir, default_model):
    """The embedded default itself (its architecture, warm start, rollout sizes), 2 steps."""
    return ["logger=none", f"model.cache_dir={cache_dir}", "task.eval_size=16", "steps=2", "eval.every=2"]


# The tricks "not in the seed review" run the way they can act: with PPO
# mini-batches (the ratio moves), and where they need more, with what makes them act here.
NOT_IN_REVIEW = {name for name, (_, trick) in REGISTERED.items() if trick.verdict == "not_in_review"}
ACTS_WITH = {
    "rollout_token_truncate": ["rollout.dtype=bfloat16"], "rollout_token_mask": ["rollout.dtype=bfloat16"],
    "rollout_sequence_truncate": ["rollout.dtype=bfloat16"], "rollout_sequence_mask": ["rollout.dtype=bfloat16"],
    "off_policy_mask": ["off_policy_mask.delta=0.0"],    # a 2-step run never drifts by 0.5 nats a token
    "ref_sync": ["ref_sync.every=2"],
    # the corrections of stale rollouts act once a stale policy samples (step 2 of 2)
    "decoupled_ppo": ["staleness=fixed"], "proximal_loglinear": ["staleness=fixed"],
    "proximal_behaviour": ["staleness=fixed"],
    "cispo_rollout_anchor": ["staleness=fixed"],   # pi / mu moves at the first mini-batch too
    "m2po": ["staleness=fixed", "rollout_correction.threshold=1e-8"],   # two steps drift far below 0.04
    "mixed_staleness": ["staleness.stale_frac=1.0"],
    "fp32_lm_head": ["+model.dtype=bfloat16"],
    "no_positive_resampling": ["prompt_pool.size=8"],     # step 2 starts a second epoch: retirement acts
    # trust-region masking acts once a stale policy samples and the bound is below its drift
    "trust_region_mask": ["staleness=fixed", "rollout_correction.high=1e-8"],
    "kpop": ["staleness=fixed", "rollout_correction.high=1e-8"],   # two steps never drift by a KL of 2
    "ref_update_interval": ["ref_sync.every=2"],
    # AReaL's other conventions: the ramp over every length, any flat group replaced, a stale sampler
    "difficulty_aware_penalty": ["overlong.buffer=32"],
    "dynamic_sampling_replace": ["sampling.min_replace_ratio=0.0"],
    "vcpo_ess_lr": ["staleness=fixed"],
    # the combined-ratio gates act once a stale policy samples and the bound is below its drift (two steps of one
    # step's lag never reach pi / mu = 3)
    "combined_ratio_truncate": ["staleness=fixed", "rollout_correction.high=1.001"],
    "combined_ratio_mask": ["staleness=fixed", "rollout_correction.high=1.001"],
    "train_env_tokens": ["task=calculator"],   # a multi-turn task: tool replies to train on
    "turn_level_credit": ["task=calculator"],   # a multi-turn task: tool calls rewarded per turn
    "merged_turn_reward": ["task=calculator"],
    "turn_mean": ["task=calculator"],          # a multi-turn task: episodes of several turns
    "turn_gae": ["task=calculator"],           # a multi-turn task: episodes of several turns
}


# slow: the embedded default's own warm start (minutes on 2 cores) and ~60 two-step runs
@pytest.mark.slow
@pytest.mark.parametrize("name", TRICKS)
def test_every_named_trick_trains_two_steps_on_the_tiny_default(tiny_default, tmp_path, name):
    # value_clip needs a critic: alone it is refused (tested below), so pair it with critic_gae
    overrides = tiny_default + ["+trick=[critic_gae,value_clip]" if name == "value_clip" else f"+trick={name}"]
    if name in NOT_IN_REVIEW:
        overrides += ["updates=mini_batches", *ACTS_WITH.get(name, [])]
    cfg = compose(overrides)
    family = cfg.tricks[name].family
    assert cfg[family].name == cfg.tricks[name].option
    result = train(cfg, tmp_path / "run", overrides)
    assert result.state == "completed"
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")
    assert all(v is not None for r in rows for v in r.values())          # finite (NaN is null)
    registered, _ = REGISTERED[name]                                     # the metrics it writes every step
    assert all(metric in r and "loss" in r for r in rows[1:] for metric in registered.metrics)
    assert f"  {name}:" in (tmp_path / "run" / "config.yaml").read_text()
    activity = registered.activity
    if name in NOT_IN_REVIEW and activity is not None:                   # it acted: its own metric says so
        values = [r[activity.metric] for r in rows[1:]]
        assert shows_activity(values, activity.kind, activity.threshold), (activity.metric, values)


def test_two_tricks_compose():
    cfg = compose(["+trick=[clip_higher,token_mean]"])
    validate(cfg)
    assert cfg.clip.name == "higher" and cfg.loss_agg.name == "token_mean"
    assert set(cfg.tricks) == {"clip_higher", "token_mean"}


@pytest.mark.parametrize("overrides, message", [
    (["+trick=[token_mean,dr_grpo_norm]"], "tricks dr_grpo_norm and token_mean both set family 'loss_agg'"),
    (["+trick=clip_higher", "clip=symmetric"], "trick clip_higher sets clip=higher, but clip=symmetric"),
])
def test_conflicting_tricks_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))


def test_conflict_on_the_command_line_is_one_line(tmp_path):
    out = cli("train", "+trick=[kl_fixed,kl_adaptive]", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: tricks kl_adaptive and kl_fixed both set family 'kl'; they are alternatives: pick one"]
    assert not any(tmp_path.iterdir())


def test_unknown_trick_lists_the_known_ones(tmp_path):
    out = cli("train", "+trick=nope", cwd=tmp_path)
    assert out.returncode == 2 and "clip_higher" in out.stderr and len(out.stderr.strip().splitlines()) == 1


PRESETS = {
    "grpo": {"adv": "grpo", "clip": "symmetric", "loss_agg": "seq_mean_token_mean", "kl": "fixed"},
    "dr_grpo": {"adv": "dr_grpo", "clip": "symmetric", "loss_agg": "constant", "kl": "none"},
    "lite_ppo": {"adv": "lite", "clip": "symmetric", "loss_agg": "token_mean", "kl": "none"},
    "dapo": {"adv": "grpo", "clip": "higher", "dual_clip": "enabled", "loss_agg": "token_mean", "kl": "none",
             "overlong": "soft_punish", "sampling": "dynamic", "entropy": "none"},
    "blog": {"adv": "grpo", "clip": "symmetric", "loss_agg": "seq_mean_token_mean", "kl": "adaptive",
             "length": "group", "entropy": "adaptive", "temperature": "learnable"},
    "gspo": {"adv": "grpo", "clip": "gspo", "loss_agg": "seq_mean_token_mean", "kl": "none"},
    "cispo": {"adv": "grpo", "clip": "cispo", "loss_agg": "token_mean", "kl": "none"},
    "scalerl": {"adv": "lite", "clip": "cispo_trl", "loss_agg": "token_mean", "kl": "none"},
}


RATIO_PRESETS = {"gspo", "cispo", "scalerl"}   # ratio-based: trained with mini-batches, where the ratio moves


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_match_the_table_and_train(tiny_default, tmp_path, preset):
    overrides = tiny_default + [f"preset={preset}"] + (["updates=mini_batches"] if preset in RATIO_PRESETS else [])
    cfg = compose(overrides)
    assert {family: cfg[family].name for family in PRESETS[preset]} == PRESETS[preset]
    assert train(cfg, tmp_path / "run", overrides).state == "completed"
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")
    assert all(v is not None for r in rows for v in r.values())
    if preset in RATIO_PRESETS:
        metric, kind, threshold = activity_of("clip", cfg.clip.name)
        assert shows_activity([r[metric] for r in rows[1:]], kind, threshold)


def test_a_preset_is_overridable_family_by_family():
    cfg = compose(["preset=lite_ppo", "kl=fixed", "+trick=clip_higher"])
    validate(cfg)
    assert (cfg.adv.name, cfg.kl.name, cfg.clip.name) == ("lite", "fixed", "higher")


def test_dapo_preset_uses_its_scripts_dual_clip_constant():
    assert compose(["preset=dapo"]).dual_clip.c == 10.0


def test_value_clip_without_a_critic_says_why(tmp_path):
    out = cli("train", "+trick=value_clip", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: value_clip=clip needs a critic, and adv=grpo has none: value clipping exists only "
        "with adv=gae (add +trick=critic_gae)")
