"""When a trick cannot act (grpo_ablate/inert.py): the rules on composed configs, the warning
of `train`, the refusal of `sweep` and `doctor`, the requirement `grpo-ablate tricks` shows."""
import pytest

from grpo_ablate.config import compose
from grpo_ablate.inert import chosen_tricks, inert_reason, inert_tricks, requirement


@pytest.mark.parametrize("overrides, family, option, needle", [
    (["clip=higher"], "clip", "higher", "one optimizer step per rollout"),
    (["dual_clip=enabled"], "dual_clip", "enabled", "one optimizer step per rollout"),
    (["adv=gae", "value_clip=clip"], "value_clip", "clip", "V never moves away from V_old"),
    (["reward_norm=batch"], "reward_norm", "batch", "normalizes again"),
    (["reward_norm=batch", "adv=lite"], "reward_norm", "batch", "normalizes again"),
    (["kl=none", "kl.estimator=k2"], "kl.estimator", "k2", "only changes a logged metric"),
    (["kl=fixed", "kl_weight=length_budget", "kl_weight.budget=40"], "kl_weight", "length_budget",
     "no completion is longer"),
    (["adv_clip=clip", "rollout.group_size=4"], "adv_clip", "clip", "(G-1)/sqrt(G)"),
    (["entropy=bonus", "entropy.coef=0"], "entropy", "bonus", "entropy.coef=0"),
    (["kl=adaptive", "kl.beta=0"], "kl", "adaptive", "kl.beta=0"),
])
def test_a_config_in_which_the_option_cannot_act(overrides, family, option, needle):
    reason = inert_reason(compose(overrides), family, option)
    assert reason is not None and needle in reason and ": " in reason   # why, then the fix


@pytest.mark.parametrize("overrides, family, option", [
    (["clip=higher", "updates=mini_batches"], "clip", "higher"),
    (["clip=higher", "updates=multi"], "clip", "higher"),
    (["dual_clip=enabled", "updates.epochs=2"], "dual_clip", "enabled"),
    (["reward_norm=batch", "adv=dr_grpo"], "reward_norm", "batch"),      # no std: the scale survives
    (["kl=fixed", "kl.estimator=k2"], "kl.estimator", "k2"),
    (["adv_clip=clip", "rollout.group_size=8"], "adv_clip", "clip"),      # a lone success: A = 2.47 > 2
    (["adv_clip=clip", "rollout.group_size=4", "length=penalty"], "adv_clip", "clip"),   # shaped rewards
    (["entropy=bonus"], "entropy", "bonus"),
    (["kl=fixed", "kl_weight=length_budget"], "kl_weight", "length_budget"),
    (["length=group"], "length", "group"),                                 # no rule: it can act
])
def test_a_config_in_which_the_option_can_act(overrides, family, option):
    assert inert_reason(compose(overrides), family, option) is None


def test_the_tricks_a_run_asked_for_and_the_warnings_it_gets():
    overrides = ["+trick=[clip_higher,token_mean]", "dual_clip=enabled", "seed=3"]
    cfg = compose(overrides)
    chosen = chosen_tricks(cfg, overrides)
    assert set(chosen) == {"clip_higher", "token_mean", "dual_clip=enabled"}
    assert [name for name, _ in inert_tricks(cfg, chosen)] == ["clip_higher", "dual_clip=enabled"]
    assert inert_tricks(compose(overrides + ["updates=mini_batches"]), chosen) == []


def test_requirement_is_what_the_catalogue_shows():
    assert "several optimizer steps per rollout" in requirement("clip", "higher")
    assert requirement("length", "group") == ""
    from grpo_ablate.catalogue import load_catalogue

    rows = {r["name"]: r for r in load_catalogue()}
    assert "several optimizer steps" in rows["clip_higher"]["requires"] and rows["length_group"]["requires"] == "-"
