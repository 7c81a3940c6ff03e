"""Family `sampling`: which sampled groups make up the batch of an optimizer step.

Each option is a group filter, scores [groups, G] (the verifier's rewards) -> keep [groups],
plus `max_rounds` in its config: the trainer samples fresh prompts round after round until
`prompts_per_step` groups are kept or the rounds run out, then proceeds with what it kept
(never crashing: verl raises here, which users hit in verl issues 953 and 1108).

`static`: every group is kept, one round.
`dynamic` (DAPO dynamic sampling; verl `filter_groups`, metric=acc): groups whose rewards are
all equal carry no group-relative signal and are dropped.
`zero_variance`: the same filter in one round (max_rounds 1; SkyRL `zero_variance_filter`, which
loss-masks them): dropped without a refill, the step trains on fewer groups.
`dynamic_group` (seed review "dynamic group size"; no reference): every group is kept, and a
group whose rewards are all equal gets `g_step` more completions at a time, up to `g_max`
(the trainer does this for any option that sets g_max > group_size); advantages are then
computed on ragged groups.
`dynamic_fallback` (slime `check_reward_nonzero_std_with_fallback`): one round of
ceil(over_sample x B) prompts; a flat group is dropped only while enough candidates remain to
fill the batch, so no second round is ever sampled.

`variance_mass` (RAGEN-2 SNR-aware filtering): every group stays in the batch, and the groups
holding a share `top_p` of the batch's reward variance (or the `top_k` highest) are the ones the
loss trains on; the other groups' completions are masked out of it before the advantage
(`masks_groups`: train/batch.py records the rows, train/step.py masks them).

How many prompts a later round draws is the `refill` setting of the options that refill
(`dynamic`, `advantage_range`; `round_prompts`): B every round (absent or `batch`: verl's
filter_groups loop), twice the groups the last round dropped (`double`: verl's v1 sync
trainer) or exactly the groups still missing (`exact`: verl's v1 async trainer).
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import (DAPO, FLAG, NUMBER, POSITIVE_INT, SEED_REVIEW, Activity, Claim, Inert,
                                         Allowed, ReadWhen, Trick, choice, declare_family, register)

REFILLS = ("batch", "double", "exact")
RAGEN2 = "RAGEN-2 (Wang et al. 2026, arXiv 2604.06268)"


def round_prompts(refill: str | None, B: int, missing: int, dropped: int, credit: int) -> tuple[int, int]:
    """(prompts the next round draws, refill credit carried after it), after a round that
    dropped `dropped` groups with `missing` groups still lacking from the batch of B.

    batch (or None): B fresh prompts a round, whatever is missing (verl's `filter_groups` loop,
    one gen batch a round; DAPO's recipe).
    double: verl v1 `ReplayBuffer.sample` in sync mode (verl/trainer/ppo/v1/replay_buffer.py,
    commit c88e875dd, #7082): each of the k groups DAPO evicts adds 2 refill credits, dispatched
    up to the in-flight limit (max_inflight_gen_batches x train_batch_size = B, its default 1);
    the rest is carried. Here a round is drained before the next is drawn, so the limit is B.
    exact: verl v1 `ReplayBufferAsync` (the same commit): k evicted, k refilled; a round model
    has every evicted group's refill in the next round, i.e. exactly the groups missing."""
    if refill in (None, "batch"):
        return B, 0
    if refill == "exact":
        return missing, 0
    credit += 2 * dropped
    n = min(credit, B)
    return n, credit - n


declare_family("sampling", "which groups form the batch; `dynamic` is DAPO's, refilling up to `max_rounds`; "
               "`dynamic_group` grows flat groups up to `g_max`",
               stage="batch", default="static", metric="sampling/kept_group_frac",
               settings={"max_rounds": POSITIVE_INT,   # sampling rounds (dynamic), group growth (dynamic_group)
                         "g_step": Allowed("integer", low=0, low_open=True, optional=True),
                         "g_max": Allowed("integer", low="rollout.group_size", optional=True),
                         # prompts of a refill round (options that refill; batch: B a round); it came after
                         # runs existed: hashed only away from batch, what every run did before
                         "refill": (Allowed("choice", choices=REFILLS, neutral="batch"), "refills"),
                         # the one round's prompts as a multiple of B (dynamic_fallback)
                         "over_sample": (Allowed(low=1, note="the round must hold at least B candidates"),
                                         "oversamples")},
               supplied={"needed": "the trainer: the groups the batch still lacks when a round is judged"},
               defaults={"max_rounds": 1, "refill": "batch"})


def _one_round(cfg) -> str | None:
    """Only `dynamic` refills: another option given max_rounds > 1 would either ignore it (it keeps
    every group in round 1) or, for zero_variance, become DAPO's dynamic sampling under another name."""
    rounds, name = cfg.sampling.get("max_rounds", 1), cfg.sampling.name
    return None if rounds == 1 else (
        f"sampling.max_rounds={rounds} is not allowed with sampling={name}, which samples one round; only "
        "sampling=dynamic refills dropped groups with more rounds (DAPO's dynamic sampling)")


@register("sampling", "static",
          what="every prompt gets exactly G completions, all of them trained on",
          checks=_one_round)
@register("sampling", "dynamic_group",
          what="dynamic group size: start with G = rollout.group_size per prompt; a group whose rewards are all equal"
               " gets g_step more completions at a time, up to g_max",
          defaults={"g_step": 4, "g_max": 16},
          checks=_one_round,
          activity=Activity("sampling/extra_generations"),
          writes=("sampling/kept_group_frac", "sampling/mean_group_size"),
          tricks=(Trick("dynamic_group_size",
                        what="grow groups without reward variance by g_step completions, up to g_max",
                        source="seed review (no framework has it)",
                        verdict="not_recommended",
                        cost="extra generations for groups without reward variance",
                        claims=(
                            Claim("helps", "", SEED_REVIEW,
                                  "dynamic group size: medium gain, at a high engineering cost (not recommended for "
                                  "that cost)"),)),))
def keep_all_groups(scores: torch.Tensor) -> torch.Tensor:
    return torch.ones(scores.shape[0], dtype=torch.bool)


@register("sampling", "dynamic",
          what="DAPO dynamic sampling: drop groups whose rewards are all equal, sample more prompts until the batch "
               "is full or max_rounds is reached (then train on what was kept, and log it)",
          defaults={"max_rounds": 4},
          notes={"max_rounds": "verl max_num_gen_batches"},
          refills=True, activity=Activity("sampling/extra_generations"),
          tricks=(Trick("dynamic_sampling",
                        what="DAPO dynamic sampling: drop zero-variance groups, refill with fresh prompts",
                        source="verl algorithm.filter_groups (DAPO recipe)",
                        verdict="not_applicable",
                        cost="up to max_rounds extra generation rounds per step",
                        claims=(
                            Claim("helps", "model=base", DAPO,
                                  "dynamic sampling (groups whose rewards are all equal are replaced) keeps every "
                                  "gradient useful: one of DAPO's four techniques"),)),
                Trick("dapo_refill_double",
                      what="DAPO dynamic sampling refilled as verl's v1 sync trainer does: each dropped group "
                           "adds two fresh prompts to the next round (at most B a round)",
                      source="verl v1 ReplayBuffer, sync mode (#7082, c88e875dd)",
                      verdict="not_in_review", cost="up to twice the dropped groups' generations per extra round",
                      settings={"refill": "double"}),
                Trick("dapo_refill_exact",
                      what="DAPO dynamic sampling refilled as verl's v1 async trainer does: exactly the missing "
                           "groups are drawn in the next round",
                      source="verl v1 ReplayBufferAsync (#7082, c88e875dd)",
                      verdict="not_in_review", cost="more, smaller rounds than refill=double",
                      settings={"refill": "exact"}),))
# the same filter in one round (conf/sampling/zero_variance.yaml: max_rounds 1): dropped, never refilled;
# it shows as sampling/kept_group_frac < 1 (no activity rule: how many it drops varies by step)
@register("sampling", "zero_variance",
          what="SkyRL zero_variance_filter: groups whose rewards are all equal are dropped, never refilled",
          checks=_one_round,
          tricks=(Trick("zero_variance_filter",
                        what="drop zero-variance groups without resampling (the batch shrinks)",
                        source="SkyRL algorithm.zero_variance_filter (skyrl/train/utils/trainer_utils.py); ScaleRL "
                               "(arXiv 2510.13786)",
                        verdict="not_in_review"),))
def keep_varied_groups(scores: torch.Tensor) -> torch.Tensor:
    return scores.amax(dim=1) > scores.amin(dim=1)


# slime's dynamic-sampling fallback (slime/rollout/filter_hub/base_types.py should_drop_dynamic_filter_output,
# dynamic_sampling_filters.py check_reward_nonzero_std_with_fallback; sglang_rollout.py generate_rollout_async;
# commit 2a60f00dd27f716f8761464086f02b02061adff1, #2250)
@register("sampling", "dynamic_fallback",
          what="slime dynamic sampling with fallback: one round of over_sample x B prompts; a group whose rewards are "
               "all equal is dropped only while enough candidates remain to fill the batch, else kept",
          defaults={"over_sample": 2},
          notes={"over_sample": "slime over_sampling_batch_size / rollout_batch_size (its example: 64 / 32)"},
          oversamples=True, checks=_one_round,
          activity=Activity("adv/zero_std_group_frac"),
          inert=Inert(lambda cfg: float(cfg.sampling.over_sample) == 1,
                      "a round of exactly B prompts has no candidate to spare: every group is kept (sampling=static)",
                      "sampling.over_sample=2", "over_sample > 1"),
          tricks=(Trick("dynamic_sampling_fallback",
                        what="drop zero-variance groups from an over-sampled round, keeping them where the batch "
                             "would otherwise fall short (no second round)",
                        source="slime check_reward_nonzero_std_with_fallback (#2250)",
                        verdict="not_in_review", cost="over_sample x B prompts generated, B trained on"),))
def keep_varied_groups_or_fill(scores: torch.Tensor, *, needed: int) -> torch.Tensor:
    """slime's fallback: the round's groups are judged in order, `needed` = the groups the batch
    still lacks and `candidates` = the round's groups not yet dropped (slime's remaining_batch_size
    counts the kept and the in-flight ones; one round here, so it starts at the round's size). A
    group with reward variance is kept; a flat one is dropped while candidates > needed (one fewer
    candidate after), and kept otherwise: dropping it would leave too few to fill the batch. So
    the kept groups are every varied group then, in order, the last needed - varied flat ones.
    slime judges groups as they finish (asynchronously); here in the round's order."""
    varied = keep_varied_groups(scores)
    keep, candidates = varied.clone(), scores.shape[0]
    for g in range(scores.shape[0]):
        if varied[g]:
            continue
        if candidates <= needed:
            keep[g] = True
        else:
            candidates -= 1
    return keep


def _rejects_every_group(cfg) -> str | None:
    """An advantage r - mean(r) of verifier scores in [0, 1] lies within +-(1 - 1/G): a range that holds
    all of that rejects every group in every round (the step trains on nothing)."""
    s, group = cfg.sampling, int(cfg.rollout.group_size)
    reach = 1 - 1 / group
    if float(s.reject_min) <= -reach and float(s.reject_max) >= reach:
        return (f"sampling.reject_min={s.reject_min}, reject_max={s.reject_max} would drop every group: with "
                f"rollout.group_size={group} every advantage r - mean(r) lies in [{-reach:g}, {reach:g}]; "
                "give a narrower range (prime-rl's default: [0, 0], groups without signal)")
    return None


# prime-rl's admission gate (src/prime_rl/orchestrator/curriculum/gates/adv.py AdvRangeGate, commit
# 559b44772e471d1538537b8805cc77f3824a5e64): a group is rejected when every advantage lies in
# [reject_min, reject_max] (AdvRangeGateConfig default [0, 0]: no learning signal). The advantages
# are prime-rl's default r - mean(r) over the group, from the verifier's rewards; rejected groups are
# refilled like dynamic's (prime-rl's orchestrator keeps sampling until the batch is full).
@register("sampling", "advantage_range",
          what="prime-rl AdvRangeGate: groups whose advantages r - mean(r) all lie in [reject_min, reject_max] are "
               "dropped, and fresh prompts sampled until the batch is full or max_rounds is reached",
          defaults={"max_rounds": 4},
          notes={"reject_min": "prime-rl AdvRangeGateConfig defaults: [0, 0] (no learning signal)"},
          knobs={"reject_min": NUMBER, "reject_max": Allowed(low="sampling.reject_min")}, refills=True,
          checks=_rejects_every_group, activity=Activity("sampling/extra_generations"),
          tricks=(Trick("advantage_range_gate",
                        what="drop groups whose advantages r - mean(r) all lie in [reject_min, reject_max], refill",
                        source="prime-rl curriculum gates type=advantage_range (AdvRangeGate)",
                        verdict="not_in_review", cost="up to max_rounds extra generation rounds per step",
                        settings={"reject_min": -0.05, "reject_max": 0.05}),))
def keep_groups_outside_advantage_range(scores: torch.Tensor, *, reject_min: float = 0.0,
                                        reject_max: float = 0.0) -> torch.Tensor:
    advantages = scores - scores.mean(dim=1, keepdim=True)
    return ~((advantages >= reject_min) & (advantages <= reject_max)).all(dim=1)


def _varied_groups_too_few(scores: torch.Tensor, min_replace_ratio: float) -> bool:
    """SkyRL's rule: a batch is usable when more than min_replace_ratio of its groups have reward variance."""
    return not int(keep_varied_groups(scores).sum()) > scores.shape[0] * min_replace_ratio


@register("sampling", "replace",
          what="SkyRL dynamic_sampling.type=replace (POLARIS): groups whose rewards are all equal are overwritten by "
               "copies of the batch's varied groups; a batch with too few varied groups is sampled again",
          defaults={"max_rounds": 30},
          notes={"max_rounds": "SkyRL max_sample_batches",
                 "min_replace_ratio": "SkyRL: replace only when more than this fraction of the groups vary"},
          replaces_flat_groups=True, knobs={"min_replace_ratio": Allowed(
              low=0, high=1, high_open=True, note="at 1 no batch is ever usable: every one would be resampled")},
          activity=Activity("sampling/replaced_groups"),
          writes=("sampling/kept_group_frac", "sampling/replaced_groups"),
          inert=Inert(lambda cfg: int(cfg.rollout.group_size) == 1,
                      "a group of one has no reward variance to judge, so no group is ever replaced",
                      "rollout.group_size=8", "groups of at least 2 completions"),
          tricks=(Trick("dynamic_sampling_replace",
                        what="replace zero-variance groups by copies of the batch's varied ones (POLARIS); "
                             "resample the batch when too few are varied",
                        source="SkyRL trainer.algorithm.dynamic_sampling.type=replace (min_replace_ratio 0.3)",
                        verdict="not_in_review", cost="a resampled batch when too few groups are varied"),))
def keep_batches_with_enough_varied_groups(scores: torch.Tensor, *, min_replace_ratio: float = 0.3) -> torch.Tensor:
    """SkyRL `handle_replace_sampling` (dynamic_sampling.type=replace; POLARIS, WebSailor): a batch in
    which more than `min_replace_ratio` of the groups have reward variance is kept whole (then
    train/state/sampling.py writes a copy of a varied group over each flat one); otherwise the whole
    batch is dropped and a fresh one sampled, up to `max_rounds` (SkyRL's max_sample_batches, 30).
    Difference: SkyRL raises when the batches run out; here the last one is trained on as it is
    (as every sampling option does). Reference: skyrl/train/utils/trainer_utils.py, commit a956457."""
    keep = not _varied_groups_too_few(scores, min_replace_ratio)
    return torch.full((scores.shape[0],), keep, dtype=torch.bool)


@register("sampling", "replay",
          what="TRL GRPOWithReplayBuffer: groups without reward variance are replaced by informative groups drawn "
               "from a buffer of the best-scored ones seen so far (score sum |A| * std)",
          notes={"size": "TRL replay_buffer_size"},
          replays=True, knobs={"size": POSITIVE_INT}, checks=_one_round,
          activity=Activity("sampling/replayed_groups"),
          tricks=(Trick("replay_buffer",
                        what="refill zero-variance groups with informative groups replayed from a buffer",
                        source="TRL experimental GRPOWithReplayBuffer (replay_buffer_size 64)",
                        verdict="not_in_review", cost="the buffer's groups in memory; no extra generation"),))
def keep_all_groups_for_replay(scores: torch.Tensor, *, size: int = 64) -> torch.Tensor:
    """Every group kept, one round; the trainer then replaces those whose rewards are all equal
    by groups drawn from a buffer of the `size` best-scored informative ones seen so far
    (train/state/sampling.py: TRL's GRPOWithReplayBufferTrainer, score sum |A| * std, drawn in proportion)."""
    return torch.ones(scores.shape[0], dtype=torch.bool)


def group_reward_variance(scores: torch.Tensor) -> torch.Tensor:
    """[groups] each group's sample variance of its rewards, ddof 1 (the three PRs' `variance_ddof`
    default, and RAGEN-2's sample variance), in float64; exactly 0 for a group whose rewards are all
    equal (as `keep_varied_groups` judges it: rounding in the mean never makes a flat group varied)
    and for a group of one (SkyRL's rule: fewer values than ddof + 1 have no variance)."""
    scores = scores.double()
    if scores.shape[1] < 2:
        return torch.zeros(scores.shape[0], dtype=torch.float64)
    return torch.where(scores.amax(dim=1) > scores.amin(dim=1), scores.var(dim=1, correction=1), 0.0)


def _variance_mass_inert(cfg) -> bool:
    s, B = cfg.sampling, int(cfg.rollout.prompts_per_step)
    if int(cfg.rollout.group_size) == 1:
        return True
    if s.strategy == "top_p":
        return bool(s.include_zero) and float(s.top_p) >= 1
    return bool(s.include_zero) and int(s.top_k) >= B


# RAGEN-2's SNR-aware filtering as the three PRs opened together on 2026-09-16 build it: SkyRL #2217
# (skyrl/train/reward_variance_filter.py and tests/test_reward_variance_filter.py, read at 4f86c72d), TRL
# #7242 (trl/trainer/grpo_trainer.py `_get_reward_variance_filter_mask`, read in the PR's review threads:
# stable descending argsort, zero groups dropped unless include_zero, searchsorted over the cumulative
# mass) and verl #7894 (its description: top_p / top_k, include_zero, ddof, masking before the advantage);
# RAGEN's own code (ragen/trainer/rollout_filter.py, RAGEN-AI/RAGEN 4ec25747) for where they disagree.
@register("sampling", "variance_mass",
          what="RAGEN-2 SNR-aware filtering: the fewest groups holding top_p of the batch's reward variance (ddof 1), "
               "highest first (or the top_k groups), are trained on; the other groups' completions are masked out of "
               "the loss before the advantage",
          knobs={"strategy": choice("top_p", "top_k"),
                 "top_p": Allowed(low=0, low_open=True, high=1, read_when=ReadWhen("strategy", ("top_p",))),
                 "top_k": Allowed("integer", low=1, high="rollout.prompts_per_step",
                                  read_when=ReadWhen("strategy", ("top_k",))),
                 "include_zero": FLAG},
          notes={"top_p": "the share of the batch's reward variance the kept groups hold (the PRs' example: 0.9)",
                 "top_k": "strategy=top_k: this many groups, highest variance first (SkyRL's default: 1)",
                 "include_zero": "whether groups without reward variance may be kept (the PRs' default: false)"},
          masks_groups=True, checks=_one_round,
          activity=Activity("sampling/masked_group_frac"),
          writes=("sampling/kept_group_frac", "sampling/masked_group_frac", "sampling/kept_variance_frac"),
          inert=Inert(_variance_mass_inert,
                      "it keeps every group: groups of one have no reward variance, or top_p=1 (top_k at least "
                      "the batch's groups) with include_zero=true selects them all",
                      "sampling.top_p=0.9 sampling.include_zero=false rollout.group_size=8",
                      "groups of at least 2 completions and a selection that can leave a group out"),
          tricks=(Trick("snr_aware_filtering",
                        what="RAGEN-2 SNR-aware filtering: train on the groups holding 90% of the batch's reward "
                             "variance, highest first; the other groups' completions are masked out of the loss",
                        source="RAGEN-2 (arXiv 2604.06268); verl #7894, TRL #7242, SkyRL #2217 (open; SkyRL's "
                               "branch read at 4f86c72d)",
                        verdict="not_in_review",
                        cost="none saved: masked completions are generated and forwarded all the same",
                        claims=(Claim("helps", "", RAGEN2,
                                      "selecting each iteration's high-signal prompts by reward variance (SNR-aware "
                                      "filtering) improves task performance across planning, math, web navigation "
                                      "and code execution, and input dependence with it"),)),))
def keep_groups_by_variance_mass(scores: torch.Tensor, *, strategy: str = "top_p", top_p: float = 0.9,
                                 top_k: int = 1, include_zero: bool = False) -> torch.Tensor:
    """RAGEN-2's SNR-aware filtering (arXiv 2604.06268): keep [groups], the groups the loss trains on.

    v_g = Var(r_g1..r_gG), ddof 1 (`group_reward_variance`), V = sum_g v_g. Candidates: the groups
    with v_g > 0 (include_zero: every group), ordered by v_g descending, ties in batch order (a
    stable sort: SkyRL's "first-seen order", TRL's argsort(stable=True)).
      top_p: the shortest prefix of the candidates whose mass reaches the target,
             sum_{i<=m} v_(i) >= top_p * V (the first m found by a left searchsorted on the cumulative
             mass, as TRL does; where rounding leaves the whole prefix short, every candidate).
      top_k: the first top_k candidates (fewer when fewer are candidates).
    The other groups' completions are masked out of the loss before the advantage (train/step.py);
    their rewards are left as they are.

    Decided where the sources disagree:
    - variance, not standard deviation: the PRs and the issue rank and sum the variance; RAGEN's own
      code (`reward_variance` in rollout_filter.py) ranks by the std and sums stds (same order, another
      prefix).
    - the kept set reaches top_p: the PRs and RAGEN subtract a `selection_eps` (0.01, in squared reward
      units) from the target, so the kept mass may fall short of top_p by it, and a batch whose
      top_p * V <= eps is masked whole. Not built: an absolute slack depends on the reward's scale
      (reward.wrong/correct), and a step here never trains on nothing.
    - top_p = 1 with include_zero keeps every group (SkyRL's special case; RAGEN returns every index
      at top_p >= 1); without it, every group with variance (zero_variance's filter, as a mask).
    - nothing selected (no group has variance and include_zero is false, or V = 0): every group is
      kept, the sampling family's rule that a step never trains on no group (the PRs mask them all:
      only the KL term and Adam's momentum would still move the weights). With include_zero and
      V = 0, top_p keeps every group (SkyRL) and top_k the first top_k in batch order (SkyRL).
    - the variance of the verifier's scores (this family's input, in [0, 1]), not of the shaped
      reward: selection and shares are the same under reward.wrong/correct's affine map.
    """
    variance = group_reward_variance(scores)
    keep = torch.zeros(variance.shape[0], dtype=torch.bool)
    order = torch.argsort(variance, descending=True, stable=True)
    if not include_zero:
        order = order[variance[order] > 0]
    total = variance.sum()
    if strategy == "top_k":
        keep[order[:top_k]] = True
    elif total == 0 or (include_zero and top_p >= 1):
        keep[:] = True
    elif len(order):
        reached = int(torch.searchsorted(variance[order].cumsum(0), top_p * total))
        keep[order[:reached + 1]] = True
    if not keep.any():
        keep[:] = True
    return keep
