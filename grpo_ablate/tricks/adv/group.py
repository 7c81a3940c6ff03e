"""Family `adv`, the estimators from the group's own rewards: each completion's reward against its
group's mean (GRPO, Dr. GRPO, RLOO, OPO, GPG, MaxRL, pass@k) or its episode's (hierarchical GRPO),
scaled by a group or batch std (GRPO, Lite PPO, batch normalization, REINFORCE++-baseline), or per
reward part (GDPO). std is
Bessel-corrected (N-1), as in TRL, verl and ROLL.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import (FLAG, POSITIVE, SCALERL, TRICKS_OR_TRAPS, Activity, Allowed, Claim, Inert,
                                         Trick, choice, register)


def group_mean_std(values: torch.Tensor, group_index: torch.Tensor):
    """Per-completion mean and Bessel-corrected std of its group (0 std for a group of one)."""
    n_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    count = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    count.index_add_(0, group_index, torch.ones_like(values))
    total = torch.zeros_like(count).index_add_(0, group_index, values)
    mean = (total / count)[group_index]
    sq = torch.zeros_like(count).index_add_(0, group_index, (values - mean) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))[group_index]
    return mean, std


@register("adv", "grpo",
          what="GRPO: A = (r - mean_group r) / (std_group r + eps)",
          uses_group_statistic=True, undoes_affine_maps=True,
          knobs={"eps": POSITIVE})
def grpo_advantage(rewards, group_index, mask, values, components, *, eps: float = 1e-6):
    """A_j = (r_j - mean_g r) / (std_g r + eps).

    Reference: TRL grpo_trainer `_generate_and_score_completions` with scale_rewards="group";
    verl core_algos `compute_grpo_outcome_advantage` (adv_estimator=grpo). eps defaults to
    verl/ROLL's 1e-6 (TRL uses 1e-4). A group whose rewards are all equal gets A = 0.
    """
    mean, std = group_mean_std(rewards, group_index)
    return (rewards - mean) / (std + eps)


def batch_std(values: torch.Tensor) -> torch.Tensor:
    """Bessel-corrected std over the whole batch of the optimizer step (0 for one value)."""
    return values.std() if values.numel() > 1 else torch.zeros((), dtype=values.dtype, device=values.device)


@register("adv", "dr_grpo",
          what="Dr. GRPO: A = r - mean_group r (no std)",
          uses_group_statistic=True,
          tricks=(Trick("no_std",
                        what="advantages without dividing by the group std (Dr. GRPO)",
                        source="TRL scale_rewards=none; verl norm_adv_by_std_in_grpo=False",
                        verdict="not_applicable",
                        claims=(
                            Claim("helps", "data=easy", TRICKS_OR_TRAPS,
                                  "on easy data, dropping the std (mean-centring only) trains more stably: "
                                  "near-uniform group rewards have a tiny std that blows up the advantages"),)),))
def dr_grpo_advantage(rewards, group_index, mask, values, components):
    """A_j = r_j - mean_g r (no division by the group std).

    Reference: Dr. GRPO (arXiv 2503.20783); TRL scale_rewards="none"; verl
    norm_adv_by_std_in_grpo=False.
    """
    mean, _ = group_mean_std(rewards, group_index)
    return rewards - mean


@register("adv", "lite",
          what="Lite PPO (Tricks or Traps): A = (r - mean_group r) / (std_batch r + eps)",
          notes={"std_of": "raw | centered (old ROLL: std of the group-centred rewards)"},
          uses_group_statistic=True, undoes_affine_maps=True,
          knobs={"eps": POSITIVE, "std_of": choice("raw", "centered")},
          tricks=(Trick("lite_norm",
                        what="group mean, batch std (Lite PPO)",
                        source="ROLL norm_mean_type=group norm_std_type=batch; TRL scale_rewards=batch",
                        verdict="not_applicable",
                        claims=(
                            Claim("helps", "", TRICKS_OR_TRAPS,
                                  "group mean with batch std is the robust combination "
                                  "(Lite PPO's normalization)"),
                            Claim("no effect", "", SCALERL,
                                  "advantage normalization moves compute efficiency, not the asymptote",
                                  measure="ceiling"))),))
def lite_advantage(rewards, group_index, mask, values, components, *, eps: float = 1e-6, std_of: str = "raw"):
    """Lite PPO: A_j = (r_j - mean_g r) / (std_B + eps): group mean, batch std.

    Reference: Tricks or Traps (arXiv 2508.08221); ROLL `compute_advantage` with
    norm_mean_type=group, norm_std_type=batch; TRL scale_rewards="batch". std_B is taken of
    the raw rewards (`std_of: raw`, ROLL today) or of the group-centred ones (`centered`, old
    ROLL).
    """
    if std_of not in ("raw", "centered"):
        raise ValueError(f"adv.std_of={std_of!r} is not allowed; allowed: raw, centered")
    mean, _ = group_mean_std(rewards, group_index)
    centred = rewards - mean
    return centred / (batch_std(rewards if std_of == "raw" else centred) + eps)


@register("adv", "batch",
          what="global normalization: A = (r - mean_batch r) / (std_batch r + eps)",
          uses_group_statistic=True, undoes_affine_maps=True,
          knobs={"eps": POSITIVE},
          tricks=(Trick("batch_norm",
                        what="batch mean and batch std",
                        source="ROLL norm_mean_type=batch norm_std_type=batch",
                        verdict="not_applicable",
                        claims=(
                            Claim("hurts", "reward=0/1", TRICKS_OR_TRAPS,
                                  "batch-level normalization collapses when the rewards are {0,1} (a skewed "
                                  "distribution); group-level is steadier"),
                            Claim("does not hurt", "reward=-1/1", TRICKS_OR_TRAPS,
                                  "batch-level normalization recovers when the rewards are {-1,1}"),)),))
def batch_advantage(rewards, group_index, mask, values, components, *, eps: float = 1e-6):
    """Global normalization: A_j = (r_j - mean_B r) / (std_B r + eps).

    Reference: ROLL `compute_advantage` with norm_mean_type=batch, norm_std_type=batch.
    """
    return (rewards - rewards.mean()) / (batch_std(rewards) + eps)


@register("adv", "rloo",
          what="RLOO: A = r - mean of the other G-1 rewards of the group",
          uses_group_statistic=True,
          tricks=(Trick("rloo",
                        what="leave-one-out baseline",
                        source="verl adv_estimator=rloo",
                        verdict="not_applicable"),))
def rloo_advantage(rewards, group_index, mask, values, components):
    """RLOO: A_j = r_j - (sum_{k != j} r_k) / (G - 1), the leave-one-out group mean.

    Reference: verl core_algos `compute_rloo_outcome_advantage` (adv_estimator=rloo).
    Equals G/(G-1) * (r_j - mean_g r).
    """
    mean, _ = group_mean_std(rewards, group_index)
    count = torch.bincount(group_index).to(rewards.dtype)[group_index]
    return (rewards - mean) * count / (count - 1).clamp(min=1)


@register("adv", "rpp_baseline",
          what="REINFORCE++-baseline: group-centred reward, whitened over all completion tokens of the batch",
          uses_group_statistic=True, undoes_affine_maps=True,
          knobs={"eps": POSITIVE},
          tricks=(Trick("rpp_baseline",
                        what="REINFORCE++-baseline: group-centred, token-whitened",
                        source="verl adv_estimator=reinforce_plus_plus_baseline",
                        verdict="not_applicable"),))
def rpp_baseline_advantage(rewards, group_index, mask, values, components, *, eps: float = 1e-8):
    """REINFORCE++-baseline: c_j = r_j - mean_g r, then whitened over all completion tokens
    of the batch: (c - mean_tok c) / sqrt(var_tok c + eps).

    Reference: verl core_algos `compute_reinforce_plus_plus_baseline_outcome_advantage`
    (adv_estimator=reinforce_plus_plus_baseline). Token statistics weight each completion by
    its token count (`mask`; equal weights without one); the variance is the population
    variance over tokens (verl's `masked_whiten` applies Bessel's correction over tokens,
    which differs by a factor (N-1)/N that vanishes with many tokens).
    """
    mean, _ = group_mean_std(rewards, group_index)
    centred = rewards - mean
    weight = (mask.sum(dim=1).to(rewards.dtype) if mask is not None else torch.ones_like(rewards))
    total = weight.sum().clamp(min=1)
    token_mean = (weight * centred).sum() / total
    token_var = (weight * (centred - token_mean) ** 2).sum() / total
    return (centred - token_mean) / torch.sqrt(token_var + eps)


# adv.weights: {reward part: weight}; the parts are the trainer's (train/rewards.py; format and
# kl only when those terms are on)
REWARD_WEIGHTS = Allowed("weights", choices=("task_reward", "overlong_reward", "length_reward", "format_reward",
                                          "kl_reward"), optional=True)


def _weighted_parts(rewards: torch.Tensor, components: dict, weights: dict | None) -> list:
    """(weight, component) pairs; a reward without parts ({}) is one part, the reward itself."""
    parts = dict(components) or {"reward": rewards}
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(parts))
    if unknown:
        raise ValueError(f"adv.weights names {', '.join(unknown)}, which the reward does not have; "
                         f"its components: {', '.join(parts)}")
    return [(float(weights.get(name, 1.0)), part.to(rewards.dtype)) for name, part in parts.items()]


@register("adv", "gdpo",
          what="GDPO (arXiv 2601.05242), verl form: each reward part (task, format, length, overlong) normalized in "
               "its group, weighted, summed, then whitened over the batch's tokens (verl adv_estimator=gdpo)",
          notes={"weights": "{component: weight}; a component not named weighs 1 (verl gdpo_reward_weights)"},
          uses_group_statistic=True,
          knobs={"eps": POSITIVE, "weights": REWARD_WEIGHTS},
          tricks=(Trick("gdpo",
                        what="GDPO: each reward part normalized in its group, summed, token-whitened",
                        source="verl adv_estimator=gdpo (arXiv 2601.05242)",
                        verdict="not_in_review"),))
def gdpo_advantage(rewards, group_index, mask, values, components, *, eps: float = 1e-6,
                   weights: dict | None = None):
    """GDPO (arXiv 2601.05242), verl form: each reward component normalized within its group,
    weighted, summed, then whitened over the batch's completion tokens.

        A_k = (c_k - mean_g c_k) / (std_g c_k + eps)          (Bessel std, as GRPO)
        S = sum_k w_k A_k
        A = (S - mean_tok S) / sqrt(var_tok S + 1e-8)       (token-weighted; Bessel over tokens)

    Reference: verl core_algos `compute_gdpo_outcome_advantage` (adv_estimator=gdpo;
    algorithm.gdpo_reward_keys / gdpo_reward_weights; verl_F.masked_whiten). `components`
    are this trainer's reward parts (task, format, length, overlong, kl in the reward), each
    already scaled by its own coefficient: the group normalization cancels that scale but
    keeps its sign (a penalty stays a penalty). GDPO's own weights are `weights` (name ->
    w_k, 1 for a component not named). `gdpo_trl` is TRL's normalize_then_sum.
    """
    total = torch.zeros_like(rewards)
    for weight, part in _weighted_parts(rewards, components, weights):
        mean, std = group_mean_std(part, group_index)
        total = total + weight * (part - mean) / (std + eps)
    tokens = mask.sum(dim=1).to(rewards.dtype)
    n = tokens.sum().clamp(min=1)
    token_mean = (tokens * total).sum() / n
    token_var = (tokens * (total - token_mean) ** 2).sum() / n * n / (n - 1).clamp(min=1)
    return (total - token_mean) * torch.rsqrt(token_var + 1e-8)


@register("adv", "gdpo_trl",
          what="GDPO, TRL form (multi_objective_aggregation=normalize_then_sum): as gdpo, whitened over completions, "
               "eps 1e-4",
          notes={"weights": "{component: weight} (TRL reward_weights)"},
          uses_group_statistic=True,
          knobs={"eps": POSITIVE, "weights": REWARD_WEIGHTS},
          tricks=(Trick("gdpo_trl",
                        what="GDPO, TRL form: parts normalized in their group, summed, whitened per completion",
                        source="TRL multi_objective_aggregation=normalize_then_sum",
                        verdict="not_in_review"),))
def gdpo_trl_advantage(rewards, group_index, mask, values, components, *, eps: float = 1e-4,
                       weights: dict | None = None):
    """GDPO, TRL form: multi_objective_aggregation="normalize_then_sum".

        A_k = (c_k - mean_g c_k) / (std_g c_k + eps);  S = sum_k w_k A_k
        A = (S - mean_B S) / (std_B S + eps)   (over completions, not tokens; Bessel std)

    Reference: TRL `_generate_and_score_completions` (normalize_then_sum branch; reward_weights;
    eps 1e-4 in both places). Differs from verl's `gdpo` in eps (1e-4 vs 1e-6) and in the
    batch whitening: one weight per completion here, one per token there.
    """
    total = torch.zeros_like(rewards)
    for weight, part in _weighted_parts(rewards, components, weights):
        mean, std = group_mean_std(part, group_index)
        total = total + weight * (part - mean) / (std + eps)
    return (total - total.mean()) / (batch_std(total) + eps)


@register("adv", "opo",
          what="OPO (arXiv 2505.23585): A = r - sum_j |o_j| r_j / sum_j |o_j|, a length-weighted group baseline (verl"
               " opo)",
          uses_group_statistic=True,
          tricks=(Trick("opo",
                        what="OPO: length-weighted group baseline",
                        source="verl adv_estimator=opo (arXiv 2505.23585)",
                        verdict="not_in_review"),))
def opo_advantage(rewards, group_index, mask, values, components):
    """OPO (arXiv 2505.23585): the group baseline weighted by completion length.

        b_g = sum_j |o_j| r_j / sum_j |o_j|,  A_j = r_j - b_g   (b = 0 for a group of one)

    Reference: verl core_algos `compute_opo_outcome_advantage` (adv_estimator=opo).
    |o_j| = mask.sum(1), the trained tokens: a completion the overlong filter masks out
    weighs 0 in its group's baseline (verl counts the response mask).
    """
    lengths = mask.sum(dim=1).to(rewards.dtype)
    n_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    weighted = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device)
    weighted.index_add_(0, group_index, lengths * rewards)
    total_length = torch.zeros_like(weighted).index_add_(0, group_index, lengths)
    count = torch.bincount(group_index, minlength=n_groups)
    baseline = torch.where(count > 1, weighted / total_length.clamp(min=1), torch.zeros_like(weighted))
    return rewards - baseline[group_index]


@register("adv", "passk",
          what="pass@k advantage (arXiv 2503.19595): only the best completion of a group learns, with (r_max - "
               "r_second) / (std_group + eps) (verl adv_estimator=grpo_passk)",
          notes={"norm_by_std": "verl norm_adv_by_std_in_grpo"},
          uses_group_statistic=True,
          knobs={"eps": POSITIVE, "norm_by_std": FLAG},
          tricks=(Trick("passk",
                        what="pass@k advantage: only the best completion of a group learns",
                        source="verl adv_estimator=grpo_passk (arXiv 2503.19595)",
                        verdict="not_in_review",
                        claims=(Claim("helps", "", "Tang et al. (arXiv 2503.19595)",
                                      "optimizing the pass@k objective (only the group's best completion learns) "
                                      "improves pass@k, the inference-time objective it targets",
                                      measure="pass@k"),)),))
def passk_advantage(rewards, group_index, mask, values, components, *, eps: float = 1e-6,
                    norm_by_std: bool = True):
    """Pass@k advantage (arXiv 2503.19595): only the best completion of each group learns.

        A_best = (r_max - r_second) [/ (std_g r + eps)],  every other A = 0

    Reference: verl core_algos `compute_grpo_passk_outcome_advantage` (adv_estimator=
    grpo_passk; norm_by_std = algorithm.norm_adv_by_std_in_grpo). Ties for the best give
    r_max - r_second = 0 whichever is picked (here the first row). verl refuses a group of
    one; here it gets A = 0.
    """
    order = torch.argsort(rewards, descending=True, stable=True)
    order = order[torch.argsort(group_index[order], stable=True)]     # by group, best first
    groups = group_index[order]
    first = torch.ones_like(groups, dtype=torch.bool)
    first[1:] = groups[1:] != groups[:-1]
    starts = first.nonzero().squeeze(1)
    has_second = (starts + 1 < len(order)) & (groups[(starts + 1).clamp(max=len(order) - 1)] == groups[starts])
    best, second = order[starts], order[(starts + 1).clamp(max=len(order) - 1)]
    gap = torch.where(has_second, rewards[best] - rewards[second], torch.zeros_like(rewards[best]))
    if norm_by_std:
        gap = gap / (group_mean_std(rewards, group_index)[1][best] + eps)
    return torch.zeros_like(rewards).index_put_((best,), gap)


@register("adv", "gpg",
          what="GPG (arXiv 2504.02546): A = alpha (r - mean_group r) / f_norm, alpha = B / #{r != 0} (verl gpg); its "
               "loss is clip=gpg",
          uses_group_statistic=True,
          knobs={"f_norm": POSITIVE},
          tricks=(Trick("gpg_advantage",
                        what="GPG advantage: group-centred reward scaled by B / #nonzero rewards",
                        source="verl adv_estimator=gpg (arXiv 2504.02546)",
                        verdict="not_in_review"),))
def gpg_advantage(rewards, group_index, mask, values, components, *, f_norm: float = 1.0):
    """GPG (Group Policy Gradient, arXiv 2504.02546): A_j = alpha (r_j - mean_g r) / f_norm.

    alpha = B / #{j : r_j != 0}, as verl's code counts it (completions with a non-zero reward;
    with rewards {0, 1} the correct ones): it rescales the batch's gradient for the rows that
    carry signal. Reference: verl
    core_algos `compute_gpg_outcome_advantage` (adv_estimator=gpg, f_norm 1.0); its loss is
    clip=gpg (-A log pi, no ratio). A group of one gets A = 0 (verl: alpha r).
    """
    alpha = rewards.numel() / torch.count_nonzero(rewards).clamp(min=1).to(rewards.dtype)
    mean, _ = group_mean_std(rewards, group_index)
    return alpha * (rewards - mean) / f_norm


@register("adv", "maxrl",
          what="MaxRL (SkyRL advantage_estimator=maxrl, prime-rl algo.type=max_rl): A = (r - mean_g r) / (mean_g r + "
               "eps)",
          notes={"eps": "SkyRL epsilon"},
          uses_group_statistic=True,
          knobs={"eps": POSITIVE},
          tricks=(Trick("maxrl",
                        what="MaxRL: A = (r - mean_g r) / mean_g r, the group mean as the scale",
                        source="SkyRL advantage_estimator=maxrl (skyrl_train/utils/ppo_utils.py); prime-rl "
                               "algo.type=max_rl (arXiv 2602.02710)",
                        verdict="not_in_review",
                        claims=(Claim("helps", "", "MaxRL (arXiv 2602.02710)",
                                      "the maximum-likelihood weighting improves pass@k over GRPO, most on hard "
                                      "prompts", measure="pass@k"),
                                Claim("does not hurt", "", "MaxRL (arXiv 2602.02710)",
                                      "... at no cost in pass@1", measure="avg@k"))),))
def maxrl_advantage(rewards, group_index, mask, values, components, *, eps: float = 1e-6):
    """MaxRL (arXiv 2602.02710): the advantage scaled by the group's mean reward instead of its
    std, so a hard prompt's rare success weighs 1/p (the maximum-likelihood gradient of pass@k).

        A_j = (r_j - mean_g r) / (mean_g r + eps);   a group of one: A_j = r_j

    Reference: SkyRL `compute_maxrl_advantage` (advantage_estimator=maxrl, epsilon 1e-6; a group
    of one gets r - 0). An all-zero group gets 0 / eps = 0. Meant for rewards in [0, 1] (a group
    mean near 0 from mixed signs would blow up, as it would there).
    """
    mean, _ = group_mean_std(rewards, group_index)
    alone = torch.bincount(group_index)[group_index] == 1
    return torch.where(alone, rewards, (rewards - mean) / (mean + eps))


def comparison_groups(roles, episodes, groups, episode_roles) -> torch.Tensor:
    """[N] the id of each trace's comparison group in prime-rl's hierarchical GRPO: (role, episode)
    for a role in `episode_roles`, (role, rollout group) for any other role; ids in order of first
    appearance. Reference: prime-rl `HierarchicalGRPOAlgorithm.score_group` (its `peers` key)."""
    scoped = set(episode_roles)
    keys: dict = {}
    ids = [keys.setdefault((role, "episode", e) if role in scoped else (role, "group", g), len(keys))
           for role, e, g in zip(roles, episodes, groups)]
    return torch.tensor(ids, dtype=torch.long)


def peer_centred(rewards: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """A_j = r_j - the mean reward of j's comparison group (`keys`); a group of one: 0."""
    mean, _ = group_mean_std(rewards, keys.to(rewards.device))
    return rewards - mean


def episode_index(group_index: torch.Tensor, episode_size: int) -> torch.Tensor:
    """[N] each row's episode: its group's rows, in row order, taken `episode_size` at a time (the
    last episode of a ragged group may be smaller); ids unique across groups."""
    n = group_index.numel()
    if n == 0:
        return group_index.clone()
    order = torch.argsort(group_index, stable=True)
    counts = torch.bincount(group_index)
    starts = counts.cumsum(0) - counts
    rank = torch.empty_like(group_index)
    rank[order] = torch.arange(n, device=group_index.device) - starts[group_index[order]]
    per_group = (int(counts.max()) + episode_size - 1) // episode_size
    return group_index * per_group + torch.div(rank, episode_size, rounding_mode="floor")


def episode_gap(rewards: torch.Tensor, group_index: torch.Tensor, episode_size: int) -> float:
    """mean over rows of |mean_episode r - mean_group r|: how far hierarchical_grpo's baselines are
    from Dr. GRPO's (0: the option acted as dr_grpo)."""
    episode_mean, _ = group_mean_std(rewards, episode_index(group_index, episode_size))
    group_mean, _ = group_mean_std(rewards, group_index)
    return float((episode_mean - group_mean).abs().mean()) if rewards.numel() else 0.0


ONE_EPISODE_PER_GROUP = Inert(
    lambda cfg: int(cfg.adv.episode_size) >= int(cfg.rollout.group_size),
    "cannot act with adv.episode_size >= rollout.group_size (one episode per group: the baseline is the group "
    "mean, adv=dr_grpo)",
    "give adv.episode_size below rollout.group_size (prime-rl's example: 4 solver attempts per proposed problem)",
    "adv.episode_size < rollout.group_size")


@register("adv", "hierarchical_grpo",
          what="hierarchical GRPO (prime-rl algo.type=hierarchical_grpo): A = r - mean r over the row's episode, "
               "the group's completions taken adv.episode_size at a time as solver attempts (no std; an episode of "
               "one gets 0)",
          notes={"episode_size": "solver attempts per proposed problem (prime-rl env.n)"},
          uses_group_statistic=True, scores_within_episodes=True,
          knobs={"episode_size": Allowed("integer", low=2)},
          activity=Activity("adv/episode_gap"), inert=ONE_EPISODE_PER_GROUP,
          writes=("adv/std", "adv/episode_gap"),
          tricks=(Trick("hierarchical_grpo",
                        what="hierarchical GRPO: each completion against the mean of its episode (episode_size "
                             "attempts), not its whole group; no std",
                        source="prime-rl algo.type=hierarchical_grpo (0b583306e, #3138; the algorithm classes of "
                               "0be5ac452, #2746)",
                        verdict="not_in_review"),))
def hierarchical_grpo_advantage(rewards, group_index, mask, values, components, *, episode_size: int = 4):
    """Hierarchical GRPO, prime-rl's form: each trace's reward minus the mean reward of its
    comparison group, which is (role, episode) for a role in `episode_agents` (the solver: the
    attempts on one proposed problem) and (role, rollout group) for the others (the proposer: the
    proposals from one source task). No std; a comparison group of one trace gets A = 0.

        A_j = r_j - mean_{k in peers(j)} r_k

    Reference: prime-rl src/prime_rl/orchestrator/algo/hierarchical_grpo.py
    `HierarchicalGRPOAlgorithm.score_group` and `HierarchicalGRPOAlgoConfig` (episode_agents), commit
    0b583306e (#3138; unchanged in substance at 559b447), on the algorithm classes of 0be5ac452
    (#2746). Here every row is a solver trace (this trainer's tasks have one role and no proposer):
    its group's completions, in row order, are taken `episode_size` at a time as the episodes (prime-rl
    `env.n` solver attempts on each of `group_size` proposed problems, with a proposer that proposes the
    source task itself and is not trained). So A = r - episode mean: Dr. GRPO's baseline over
    `episode_size` completions instead of the group's G; `episode_size >= G` is adv=dr_grpo.
    """
    episodes = episode_index(group_index, int(episode_size))
    keys = comparison_groups(["solver"] * rewards.numel(), episodes.tolist(), group_index.tolist(), ["solver"])
    return peer_centred(rewards, keys)
