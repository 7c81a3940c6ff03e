"""When a trick cannot act (grpo_ablate/config/inert.py): the rules on composed configs, the warning
of `train`, the refusal of `sweep` and `doctor`, the requirement `grpo-ablate tricks` shows."""
import pytest

from grpo_ablate.config.compose import compose
from grpo_ablate.config.inert import chosen_tricks, inert_reason, inert_tricks, requirement


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
    (["clip=gspo"], "clip", "gspo", "one optimizer step per rollout"),        # off_policy_only: every ratio loss
    (["clip=sapo"], "clip", "sapo", "one optimizer step per rollout"),
    (["off_policy_mask=sequence"], "off_policy_mask", "sequence", "log pi_sampler - log pi ≡ 0"),
    (["rollout_correction=token_truncate", "updates=mini_batches"], "rollout_correction", "token_truncate",
     "the sampler is the trainer itself"),
    (["rollout_correction=sequence_mask"], "rollout_correction", "sequence_mask", "rollout.dtype=bfloat16"),
    (["token_mask=high_entropy", "token_mask.quantile=1.0"], "token_mask", "high_entropy", "every token is kept"),
    (["ref_sync=mixup"], "ref_sync", "mixup", "ref_sync.every"),              # 512 > 60 steps
    (["ref_sync=mixup", "ref_sync.every=5", "ref_sync.alpha=0"], "ref_sync", "mixup", "never moves the reference"),
    (["kl=in_reward", "kl.estimator=k3_st"], "kl.estimator", "k3_st", "a penalty in the reward has none"),
    (["kl=none", "kl.estimator=k3_iw"], "kl.estimator", "k3_iw", "with kl.beta=0"),
    # the replay renormalises the trainer's log-probs over the kept set: the sampler is the trainer again
    (["rollout_correction=token_truncate", "rollout.top_p=0.8"], "rollout_correction", "token_truncate",
     "the sampler is the trainer itself"),
    # a bound of 0 that drops: only fresh groups are trained, the stale ones sampled for nothing
    (["+trick=spread_staleness", "staleness.max_age=0"], "staleness", "spread", "max_age=0 drops every group"),
    (["+trick=exact_staleness", "staleness.max_age=0"], "staleness", "exact", "max_age=0 drops every group"),
    (["+trick=paced_staleness", "staleness.max_age=0", "staleness.depth=0", "staleness.strategy=drop"],
     "staleness", "paced", "max_age=0 drops every group"),
    (["+trick=tv_rho_filter", "rollout.dtype=bfloat16", "rollout_correction.high=null"], "rollout_correction",
     "tv_filter", "no sequence's tokens are masked"),
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
    (["clip=cispo", "updates=mini_batches"], "clip", "cispo"),
    (["clip=clip_cov"], "clip", "clip_cov"),                               # acts on-policy too
    (["off_policy_mask=sequence", "updates=mini_batches"], "off_policy_mask", "sequence"),
    (["off_policy_mask=sequence", "rollout.dtype=bfloat16"], "off_policy_mask", "sequence"),
    (["rollout_correction=token_mask", "rollout.dtype=bfloat16"], "rollout_correction", "token_mask"),
    (["token_mask=high_entropy"], "token_mask", "high_entropy"),
    (["+trick=ref_sync"], "ref_sync", "mixup"),                            # every 10 of 60 steps
    (["ref_sync=mixup", "ref_sync.every=100", "updates=mini_batches"], "ref_sync", "mixup"),   # 240 steps
    (["kl=fixed", "kl.estimator=k3_st"], "kl.estimator", "k3_st"),
    (["kl=in_reward", "kl.estimator=k3"], "kl.estimator", "k3"),
    # a truncating sampler without the replay scores another distribution than the trainer's
    (["rollout_correction=token_truncate", "rollout.top_p=0.8", "rollout.sampling_replay=false"],
     "rollout_correction", "token_truncate"),
    (["proximal=behaviour", "rollout.top_k=5", "rollout.sampling_replay=false"], "proximal", "behaviour"),
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
    assert "several optimizer steps per rollout" in requirement("clip", "gspo")
    assert "a sampler that differs" in requirement("rollout_correction", "token_truncate")
    assert "ref_sync.every" in requirement("ref_sync", "mixup") and requirement("clip", "clip_cov") == ""
    assert requirement("length", "group") == ""
    from grpo_ablate.config.catalogue import load_catalogue

    rows = {r["name"]: r for r in load_catalogue()}
    assert "several optimizer steps" in rows["clip_higher"]["requires"] and rows["length_group"]["requires"] == "-"


def test_a_presets_families_are_read_from_the_composed_config():
    """preset=dapo set clip=higher and dual_clip=enabled without a warning: only named tricks and
    the override strings were read. Now every family the composed config moved off its default
    is checked, whatever moved it."""
    overrides = ["preset=dapo", "updates=single"]
    cfg = compose(overrides)
    chosen = chosen_tricks(cfg, overrides)
    assert {"clip=higher", "dual_clip=enabled", "loss_agg=token_mean", "sampling=dynamic"} <= set(chosen)
    assert [name for name, _ in inert_tricks(cfg, chosen)] == ["clip=higher", "dual_clip=enabled"]
    assert chosen_tricks(compose([]), []) == {}                 # the defaults: nothing chosen


def test_the_dapo_preset_takes_several_optimizer_steps_per_rollout_so_its_clip_parts_act():
    cfg = compose(["preset=dapo"])            # verl's DAPO recipe: a PPO mini-batch smaller than the batch
    assert cfg.updates.name == "mini_batches" and int(cfg.updates.mini_batches) > 1
    assert inert_tricks(cfg, chosen_tricks(cfg, ["preset=dapo"])) == []


def test_train_warns_about_a_presets_inert_parts(small, tmp_path):
    from conftest import cli

    out = cli("train", *small, "steps=1", "eval.every=1", "preset=dapo", "updates=single", "overlong.buffer=4",
              f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("warning:")]
    assert [w.split()[1] for w in warnings] == ["clip=higher", "dual_clip=enabled"], warnings
