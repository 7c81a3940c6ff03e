"""Family `adv`, the baselines of least gradient variance: each group's rewards averaged with weights that
the trainer measures under pi_old, per token (verl's Optimal Token Baseline: the accumulated logit-gradient
energy, read with `reads_token_energy`) or per trajectory (VCPO's OPOB: the score-gradient norm, read with
`reads_score_norms`).

OTB reads, in `values`, each token's logit-gradient energy
w_t = ||e_{o_t} - pi_t||^2 = 1 - 2 pi(o_t) + sum_v pi_v^2 under pi_old (the trainer computes it in
pi_old's forward; train/forward.py) and returns per-token advantages [N, T].
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import FLAG, POSITIVE, Activity, Trick, choice, register


OTB_PAPER = "arXiv 2602.07078"


def _otb_cannot_take(cfg):
    if cfg.diag.grad_conflict:
        return ("adv=optimal_token_baseline reads pi_old's per-token energy, which the gradient diagnostics' "
                "per-component advantages have not: use diag.grad_conflict=false")
    return None


def _compact(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's trained tokens moved to the left, in order (zeros after): position k is the
    row's k-th trained token (verl's tir_ variant concatenates a multi-turn row's own tokens)."""
    keep = mask.bool()
    out = torch.zeros_like(x)
    k = (keep.cumsum(dim=1) - 1).clamp(min=0)
    rows = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(x)
    out[rows[keep], k[keep]] = x[keep]
    return out


def _zero_tails(baseline, lengths, group_index, counted, n_groups):
    """Where one row of a group is strictly the longest, its baseline past the group's
    second-longest length is 0 (verl handle_zero_tail): nobody else's return is there to average."""
    neg = torch.full((n_groups,), -1, dtype=lengths.dtype, device=lengths.device)
    longest = neg.clone().scatter_reduce_(0, group_index[counted], lengths[counted], "amax")
    at_max = counted & (lengths == longest[group_index])
    n_at_max = torch.zeros(n_groups, dtype=torch.long, device=lengths.device).index_add_(
        0, group_index, at_max.long())
    shorter = counted & ~at_max
    second = neg.clone().scatter_reduce_(0, group_index[shorter], lengths[shorter], "amax").clamp(min=0)
    size = torch.zeros(n_groups, dtype=torch.long, device=lengths.device).index_add_(0, group_index, counted.long())
    lone = at_max & (n_at_max[group_index] == 1) & (size[group_index] > 1)
    cols = torch.arange(baseline.shape[1], device=baseline.device)
    tail = lone[:, None] & (cols[None, :] >= second[group_index][:, None])
    return baseline.masked_fill(tail, 0.0)


@register("adv", "optimal_token_baseline",
          what="Optimal Token Baseline (arXiv 2602.07078; verl adv_estimator=optimal_token_baseline): a per-token "
               "group baseline B_t = sum G_t W_t / sum W_t, W_t = sum_{j<=t} (1 - 2 pi_j + sum pi^2) under pi_old",
          notes={"positions": "absolute (verl optimal_token_baseline) | trained (tir_optimal_token_baseline)",
                 "zero_tail": "verl handle_zero_tail (false for OTB, true for tir at b178a3c)"},
          uses_group_statistic=True, reads_token_energy=True,
          knobs={"positions": choice("absolute", "trained"), "zero_tail": FLAG, "eps": POSITIVE},
          activity=Activity("adv/token_energy"), checks=_otb_cannot_take, writes=("adv/std", "adv/token_energy"),
          tricks=(Trick("optimal_token_baseline",
                        what="OTB: a per-token group baseline weighted by the accumulated logit-gradient energy",
                        source=f"verl adv_estimator=optimal_token_baseline ({OTB_PAPER})",
                        verdict="not_in_review", cost="pi_old's forward each step (Σπ² over the vocabulary)"),
                  Trick("tir_optimal_token_baseline",
                        what="OTB over each row's own trained tokens (multi-turn), zero tail on",
                        source=f"verl adv_estimator=tir_optimal_token_baseline ({OTB_PAPER})",
                        verdict="not_in_review", cost="pi_old's forward each step (Σπ² over the vocabulary)",
                        settings={"positions": "trained", "zero_tail": True})))
def optimal_token_baseline_advantage(rewards, group_index, mask, values, components, *, positions: str = "absolute",
                                     zero_tail: bool = False, eps: float = 1e-8):
    """Optimal Token Baseline (arXiv 2602.07078), verl's form: one baseline per group and token,

        W_t = sum_{j<=t} w_j,   w_j = 1 - 2 pi_old(o_j) + sum_v pi_old(v)^2   (`values`, per token)
        B_t = sum_i G_t^i W_t^i m_t^i / (sum_i W_t^i m_t^i + eps),   A_t = (G_t - B_t) m_t

    G_t is the reward-to-go (the outcome reward on the last trained token: r on every trained
    token); the sums run over the group's rows; a group of one has B = 0 (A = r). W is the
    "realized energy" up to t: a token on a path that has been uncertain weighs more in the
    baseline. Reference: verl core_algos `compute_optimal_token_baseline_advantage`
    (adv_estimator=optimal_token_baseline) and `compute_multi_turn_optimal_token_baseline_advantage`
    (tir_optimal_token_baseline), commit b178a3c; verl_F `calculate_sum_pi_squared_from_logits`.
    `positions`: `absolute` (OTB: t is the column) or `trained` (tir: t counts the row's own trained
    tokens, and rows without any leave their group's count). The two agree whenever every row's
    trained tokens are one run from its first column, as in this trainer's single-turn rows.
    `zero_tail` (verl handle_zero_tail; default False for OTB, True for tir at b178a3c): a group's
    strictly longest row gets B = 0 beyond the second-longest length. eps 1e-8 as verl.
    Differences: the energy comes from this trainer's pi_old forward at the sampling temperature
    (verl's `old_log_probs` forward, logits / T); with rollout_correction on, the trainer scales
    w_t by the weight^2 as verl does with its `rollout_is_weights`; no std division, as verl.
    """
    if positions not in ("absolute", "trained"):
        raise ValueError(f"adv.positions={positions!r} is not allowed; allowed: absolute, trained")
    m = mask.to(rewards.dtype)
    energy = values.to(rewards.dtype) * m
    cumulative = energy.cumsum(dim=1)
    returns = rewards[:, None] * m                        # reward-to-go of an outcome reward
    counted = torch.ones_like(rewards, dtype=torch.bool)
    if positions == "trained":
        cumulative, returns, m = _compact(cumulative, mask), _compact(returns, mask), _compact(m, mask)
        counted = mask.sum(dim=1) > 0
    n_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    weighted = torch.zeros(n_groups, m.shape[1], dtype=rewards.dtype, device=rewards.device)
    numerator = weighted.index_add(0, group_index, returns * cumulative * m)
    denominator = weighted.index_add(0, group_index, cumulative * m) + eps
    size = torch.zeros(n_groups, dtype=torch.long, device=rewards.device).index_add_(0, group_index, counted.long())
    baseline = torch.where((size[group_index] > 1)[:, None], (numerator / denominator)[group_index],
                           torch.zeros_like(returns))
    if zero_tail:
        baseline = _zero_tails(baseline, m.sum(dim=1).long(), group_index, counted, n_groups)
    advantages = (returns - baseline) * m
    if positions == "trained":   # back to the columns the tokens came from
        k = (mask.bool().cumsum(dim=1) - 1).clamp(min=0)
        advantages = advantages.gather(1, k) * mask.to(rewards.dtype)
    return advantages


VCPO = "arXiv 2602.17616"


def _opob_cannot_take(cfg):
    if cfg.diag.grad_conflict:
        return ("adv=opob reads each trajectory's score-gradient norm, which the gradient diagnostics' "
                "per-component advantages have not: use diag.grad_conflict=false")
    if cfg.model.fsdp:
        return "adv=opob needs each trajectory's whole gradient, which model.fsdp=true shards: use model.fsdp=false"
    return None


def opob_weights(values, mask, *, is_weights: bool, length_normalize: bool):
    """[N] W_i = ||g_i||^2 (x rho_i^2) (/ L_i^2): `values` [N, 2] holds ||g_i||^2 and log rho_i, the
    sequence's log importance ratio log pi_old/mu (0 where mu is unknown); L_i the trained tokens.
    A row without a trained token weighs 0."""
    lengths = mask.to(values.dtype).sum(dim=1)
    w = values[:, 0].clone()
    if is_weights:
        w = w * torch.exp(2.0 * values[:, 1].clamp(-20.0, 20.0))
    if length_normalize:
        w = w / lengths.clamp(min=1.0) ** 2
    return torch.where(lengths > 0, w, torch.zeros_like(w))


@register("adv", "opob",
          what="VCPO's optimal off-policy baseline (arXiv 2602.17616; vcpo actor.grad_baselining): per group, b = sum"
               " W_i r_i / sum W_i with W_i = ||grad log pi(o_i)||^2 (pi_old/mu)^2, A = r - b",
          notes={"is_weights": "use_is_weights: W carries the sequence importance ratio squared",
                 "length_normalize": "normalize_by_length: W / L^2",
                 "std_normalize": "norm_by_std: (r - b) / the group's population std"},
          uses_group_statistic=True, reads_score_norms=True,
          knobs={"is_weights": FLAG, "length_normalize": FLAG, "std_normalize": FLAG, "eps": POSITIVE},
          activity=Activity("adv/score_norm_cv"), checks=_opob_cannot_take,
          writes=("adv/std", "adv/score_norm", "adv/score_norm_cv"),
          tricks=(Trick("vcpo_opob",
                        what="VCPO's optimal off-policy baseline: each group's rewards averaged with weights "
                             "||grad log pi(o_i)||^2 x (pi_old/mu)^2, the baseline of least gradient variance",
                        source=f"VCPO actor.grad_baselining ({VCPO})", verdict="not_in_review",
                        cost="one forward and backward per trajectory each step"),))
def opob_advantage(rewards, group_index, mask, values, components, *, is_weights: bool = True,
                   length_normalize: bool = False, std_normalize: bool = False, eps: float = 1e-8):
    """VCPO's optimal off-policy baseline (OPOB, arXiv 2602.17616): per group,

        b = sum_i W_i r_i / (sum_i W_i + eps),   W_i = ||g_i||^2 rho_i^2 [/ L_i^2],   A_i = r_i - b

    g_i = grad_theta sum_t log pi(o_t) is trajectory i's score gradient (under pi_old, before the
    update), rho_i = prod_t pi_old(o_t)/mu(o_t) its sequence importance ratio. b minimizes
    sum_i W_i (r_i - b)^2, the second moment of the weighted per-trajectory gradients
    rho_i g_i (r_i - b): the baseline of least variance, where GRPO's mean weighs every
    trajectory alike. `values` [N, 2]: ||g_i||^2 and log rho_i (the trainer's plugin computes
    them, train/state/adv.py, with one forward and backward per trajectory).
    Reference: mit-han-lab/vcpo c7f030f, recipe/fully_async_policy/vcpo.py `compute_opob_baseline`
    (agg_mode mean, scope group; use_is_weights true, normalize_by_length false) and the Megatron
    actor's `_update_grad_buffers` (norm_by_std: (r - b)/std with the population std, only where
    std > 1e-8). Differences: VCPO's g_i carries its token TIS weights and the loss's length
    scaling; here it is the plain score gradient. Its `use_clipped_is_ratios`, `agg_mode`
    median / winsorized_mean and `scope=minibatch` are not offered. A row without a trained token
    weighs 0; a group whose weights are all 0 gets b = 0.
    """
    w = opob_weights(values.to(rewards.dtype), mask, is_weights=is_weights, length_normalize=length_normalize)
    n_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    zeros = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device)
    baseline = zeros.index_add(0, group_index, w * rewards) / (zeros.index_add(0, group_index, w) + eps)
    advantages = rewards - baseline[group_index]
    if std_normalize:
        count = zeros.index_add(0, group_index, torch.ones_like(rewards))
        mean = zeros.index_add(0, group_index, rewards) / count
        std = (zeros.index_add(0, group_index, (rewards - mean[group_index]) ** 2) / count).sqrt()[group_index]
        advantages = torch.where(std > 1e-8, advantages / std, advantages)
    return advantages
