"""Family `clip`: the policy loss, per token. Every option takes (logp, old_logp, advantages, mask)
-- [N, T] log-probs of the current and the rollout-time policy, [N, 1] or [N, T] advantages,
the [N, T] float mask of trained tokens -- and returns (loss [N, T], stats), stats a dict
metric name -> per-token float tensor [N, T] that the trainer token-averages over the mask.
The loss is aggregated afterwards by `loss_agg` (sum_t w_t l_t); a sequence-level loss
returns a per-token tensor whose aggregation under the mode its reference uses reproduces
the reference (named in each docstring).

Notation: rho_t = exp(logp_t - old_logp_t), Delta_t = logp_t - old_logp_t, sg = stop-gradient.

PPO clip (`symmetric`, `higher`):
    loss_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)
`symmetric`: eps_low = eps_high = 0.2. `higher` (DAPO clip-higher) raises eps_high to 0.28.
Reference: verl core_algos `compute_policy_loss_vanilla` (clip_ratio_low / clip_ratio_high);
TRL `_compute_loss` (epsilon_low / epsilon_high). log rho is clamped to [-20, 20] before exp.
With one update per rollout rho == 1, nothing clips and the fractions are 0: expected.

Family `dual_clip` (`dual_clip_c`, verl `clip_ratio_c`, default 3; DAPO's script uses 10):
for A < 0 the objective becomes max(min(rho A, clip(rho) A), c A), i.e. the loss is capped
at -c A, so a token with rho > c and A < 0 gets no gradient. TRL's two-sided `delta`
(INTELLECT-2) is the same cap: min(rho, delta) on the unclipped branch = dual clip, c = delta.

Flags: `off_policy_only` -- the option's gradient equals plain PPO-clip's when rho == 1, so
it can act only with several optimizer steps per rollout or a sampler-trainer mismatch.
`per_sequence_loss` -- one loss value per sequence (gmpo): token-level importance weights of
rollout_correction enter per sequence (setting clip.is_weights, see gmpo_loss).
`sequence_ratio` -- one importance ratio per sequence, whose reference objective counts each
sequence once (gspo, gmpo, luspo: under seq_mean_token_mean); a loss_agg that `weights_by_length`
changes that objective (grpo_ablate/pair_rules.py warns).
"""
from __future__ import annotations


from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import ONE_STEP, one_forward_statistic, one_optimizer_step
from grpo_ablate.tricks.registry import (DAPO, NON_NEGATIVE, NUMBER, POSITIVE, TRICKS_OR_TRAPS, Activity, Claim, Inert,
                                         Allowed, Trick, choice, declare, declare_family, option, register)

declare_family("clip", "the policy loss: PPO ratio clip ε_low/ε_high (`higher` is DAPO clip-higher), or a 2025-26 "
               "variant (sequence ratio, clipped IS weight, soft gate, geometric mean, covariance masks, plain "
               "REINFORCE); all but `clip_cov` act only with several optimizer steps per rollout",
               stage="loss", default="symmetric",
               metric="clip/high_frac",
               supplied={"dual_clip_c": "dual_clip.c", "generator": "the trainer (seeded, checkpointed)"},
               # a per-sequence loss (gmpo): token-level rollout IS weights as their per-sequence
               # geometric mean (verl) or each token's own (token); read by the trainer (train/losses.py)
               settings={"is_weights": (choice("geometric", "token"), "per_sequence_loss")},
               defaults={"is_weights": "geometric"})
declare_family("dual_clip", "dual-clip PPO for A < 0, c = 3", stage="loss", metric="clip/dual_frac",
               settings={"c": Allowed(low=1, low_open=True, optional=True,   # handed to the policy loss as dual_clip_c
                                   note="the loss of a negative-advantage token is capped at -c A")})
EPS = {"eps_low": POSITIVE, "eps_high": POSITIVE}
RATIO_MOVES = Activity("ppo/kl")   # equal to PPO-clip's gradient while rho == 1: the ratio must move

LOG_RATIO_LIMIT = 20.0
GSPO_LOG_RATIO_MAX = 10.0    # verl clamps the sequence log-ratio from above at 10 (GSPO)


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    return torch.exp((logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def float_like(flags: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Boolean per-token indicators as floats of the loss's shape (for token-averaged metrics)."""
    return flags.to(like.dtype).expand_as(like).detach()


def _clip_fractions(ratio, advantages, low: float, high: float, like) -> dict:
    """A token is clipped when the clamp is the active branch of the pessimistic min."""
    with torch.no_grad():
        return {"clip/low_frac": float_like((ratio < low) & (advantages < 0), like),
                "clip/high_frac": float_like((ratio > high) & (advantages > 0), like)}


@register("clip", "symmetric",
          what="PPO ratio clip, 1 - eps_low .. 1 + eps_high",
          off_policy_only=True,
          knobs=EPS,
          inert=ONE_STEP)
@register("clip", "higher",
          what="DAPO clip-higher: a wider upper bound keeps low-probability tokens growing",
          defaults={"eps_high": 0.28},
          off_policy_only=True,
          knobs=EPS,
          inert=ONE_STEP,
          activity=Activity("ppo/ratio_max", "above", 1.2),
          tricks=(Trick("clip_higher",
                        what="DAPO clip-higher, eps_high 0.28",
                        source="verl clip_ratio_high; TRL epsilon_high",
                        verdict="not_applicable",
                        claims=(
                            Claim("helps", "model=aligned", TRICKS_OR_TRAPS,
                                  "raising the upper clip bound (0.2 -> 0.28) helps aligned models explore (less "
                                  "entropy collapse)"),
                            Claim("does not help", "model=base", TRICKS_OR_TRAPS,
                                  "on base models raising the upper clip bound does little or harms"),
                            Claim("helps", "model=base", DAPO,
                                  "clip-higher keeps the entropy from collapsing: one of DAPO's four techniques "
                                  "(Qwen2.5-32B base)"),)),))
def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                  eps_low: float = 0.2, eps_high: float = 0.2, dual_clip_c: float | None = None):
    """Per-token clipped policy loss and per-token clip indicators (floats, for metrics).

    `advantages` broadcasts against logp ([B, 1] per sequence or [B, T] per token).
    """
    ratio = importance_ratio(logp, old_logp)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    stats = _clip_fractions(ratio, advantages, 1.0 - eps_low, 1.0 + eps_high, loss)
    stats["clip/dual_frac"] = torch.zeros_like(stats["clip/low_frac"])
    if dual_clip_c is not None:
        capped = torch.minimum(loss, -dual_clip_c * advantages)   # max(obj, c A) as a loss
        negative = advantages < 0
        with torch.no_grad():
            stats["clip/dual_frac"] = (negative & (capped < loss)).to(logp.dtype)
        loss = torch.where(negative, capped, loss)
    return loss, stats


@register("clip", "gspo",
          what="GSPO (arXiv 2507.18071): one ratio per sequence, s = exp(mean_t log(pi / pi_old)), clipped at the "
               "sequence level (verl loss_mode=gspo; TRL importance_sampling_level=sequence). Pair with "
               "loss_agg=seq_mean_token_mean, the paper's aggregation (preset=gspo does).",
          notes={"eps_low": "the paper's and verl's example (ratios per sequence move far less)"},
          off_policy_only=True, sequence_ratio=True,
          knobs=EPS,
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          tricks=(Trick("gspo",
                        what="GSPO: one ratio per sequence (geometric mean), clipped per sequence",
                        source="verl loss_mode=gspo; TRL importance_sampling_level=sequence (arXiv 2507.18071)",
                        verdict="not_in_review"),))
def gspo_loss(logp, old_logp, advantages, mask, *, eps_low: float = 3e-4, eps_high: float = 4e-4):
    """GSPO (arXiv 2507.18071): one importance ratio per sequence, clipped at the sequence level.

        s_i = exp(mean_t Delta_t)   (mean over the sequence's trained tokens)
        s_it = sg(s_i) pi_t / sg(pi_t)   (value s_i, gradient s_i grad log pi_t)
        loss_t = max(-A s_it, -A clip(s_it, 1 - eps_low, 1 + eps_high))

    Reference: verl core_algos `compute_policy_loss_gspo` (loss_mode=gspo, this per-token
    form; log s_it clamped <= 10); TRL `_compute_loss` with importance_sampling_level=
    "sequence" (a [B, 1] ratio, no clamp). Under loss_agg=seq_mean_token_mean (the paper's
    and TRL's `grpo` aggregation) both give mean_i max(-A_i s_i, -A_i clip(s_i)) with the
    gradient -(A_i s_i / |o_i|) sum_t grad log pi_t of each unclipped sequence; under
    token_mean (verl's default mode) verl's per-token form weights sequences by length.
    Defaults eps 3e-4 / 4e-4: the paper's and verl's example (examples/gspo_trainer).
    """
    mask = mask.to(logp.dtype)
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1)
    seq_log_ratio = ((logp - old_logp) * mask).sum(dim=-1, keepdim=True) / lengths
    log_s = (logp - logp.detach() + seq_log_ratio.detach()).clamp(max=GSPO_LOG_RATIO_MAX)
    s = torch.exp(log_s)
    loss = torch.maximum(-advantages * s, -advantages * s.clamp(1.0 - eps_low, 1.0 + eps_high))
    return loss, _clip_fractions(s, advantages, 1.0 - eps_low, 1.0 + eps_high, loss)


@register("clip", "cispo",
          what="CISPO, verl form (MiniMax-M1, arXiv 2506.13585): -sg(clip(rho, 1 - eps_low, 1 + eps_high)) A log pi; "
               "the weight is clipped, the gradient never cut (verl loss_mode=cispo)",
          notes={"eps_low": "verl's example: no lower bound in practice, as in MiniMax-M1"},
          off_policy_only=True,
          knobs=EPS,
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          tricks=(Trick("cispo",
                        what="CISPO: -sg(clip(rho)) A log pi, the IS weight clipped, never the gradient",
                        source="verl loss_mode=cispo (MiniMax-M1, arXiv 2506.13585)",
                        verdict="not_in_review"),))
def cispo_loss(logp, old_logp, advantages, mask, *, eps_low: float = 10.0, eps_high: float = 0.2):
    """CISPO, verl form (MiniMax-M1, arXiv 2506.13585): a REINFORCE loss whose importance weight
    is clipped and carries no gradient, so no token ever loses its gradient.

        loss_t = -sg(clip(rho_t, 1 - eps_low, 1 + eps_high)) A_t log pi_t
        gradient: -clip(rho_t) A_t grad log pi_t

    Reference: verl core_algos `compute_policy_loss_cispo` (loss_mode=cispo; log rho clamped
    to [-20, 20]), aggregated by verl's loss_agg_mode (token-mean by default). Defaults:
    verl's example (examples/cispo_trainer: clip_ratio_low=10, i.e. no lower bound, as in
    MiniMax-M1; clip_ratio_high=0.2). `cispo_trl` is TRL's absolute cap. The loss's value
    is -w A log pi, not a surrogate objective: compare gradients, not loss values.
    """
    ratio = importance_ratio(logp, old_logp)
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high).detach()
    loss = -weight * advantages * logp
    with torch.no_grad():
        stats = {"clip/low_frac": float_like(ratio < 1.0 - eps_low, loss),
                 "clip/high_frac": float_like(ratio > 1.0 + eps_high, loss)}
    return loss, stats


@register("clip", "cispo_trl",
          what="CISPO, TRL form (loss_type=cispo, as ScaleRL): -sg(min(rho, eps_max)) A log pi, an absolute cap",
          notes={"eps_max": "TRL epsilon_high for cispo: ScaleRL's recommended 5.0"},
          off_policy_only=True,
          knobs={"eps_max": POSITIVE},
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          tricks=(Trick("cispo_trl",
                        what="CISPO with an absolute cap: -sg(min(rho, 5)) A log pi",
                        source="TRL loss_type=cispo (ScaleRL, arXiv 2510.13786)",
                        verdict="not_in_review"),))
def cispo_trl_loss(logp, old_logp, advantages, mask, *, eps_max: float = 5.0):
    """CISPO, TRL form (ScaleRL, arXiv 2510.13786): the weight is capped absolutely, not around 1.

        loss_t = -sg(min(rho_t, eps_max)) A_t log pi_t

    Reference: TRL `_compute_loss`, loss_type="cispo" (`epsilon_high` is eps_max there; TRL
    recommends ScaleRL's 5.0), aggregated over the tokens of the whole step (TRL's cispo
    normalizer: loss_agg=token_mean). TRL does not clamp log rho; here it is clamped to
    [-20, 20] (exp(20) is far above any cap). `clip/high_frac` counts tokens whose weight was
    capped, whatever the sign of A (TRL's cispo_clip_ratio counts A > 0 only).
    """
    ratio = importance_ratio(logp, old_logp)
    loss = -ratio.clamp(max=eps_max).detach() * advantages * logp
    return loss, {"clip/high_frac": float_like(ratio.detach() > eps_max, loss)}


@register("clip", "sapo",
          what="SAPO (arXiv 2511.20347): soft gate sigmoid(tau (rho - 1)) 4 / tau instead of the hard clip (verl "
               "loss_mode=sapo; TRL loss_type=sapo); both aggregate it like seq_mean_token_mean",
          notes={"tau_pos": "tau for A > 0 (verl tau_pos; TRL sapo_temperature_pos)", "tau_neg": "tau for A <= 0"},
          off_policy_only=True,
          knobs={"tau_pos": POSITIVE, "tau_neg": POSITIVE},
          inert=ONE_STEP,
          activity=Activity("sapo/grad_weight_dev"),
          writes=("sapo/grad_weight_dev",),
          tricks=(Trick("sapo",
                        what="SAPO: soft sigmoid gate on the ratio instead of the hard clip",
                        source="verl loss_mode=sapo; TRL loss_type=sapo (arXiv 2511.20347)",
                        verdict="not_in_review"),))
def sapo_loss(logp, old_logp, advantages, mask, *, tau_pos: float = 1.0, tau_neg: float = 1.05):
    """SAPO (arXiv 2511.20347): a soft gate instead of the hard clip.

        f(rho) = sigmoid(tau (rho - 1)) 4 / tau,  tau = tau_pos if A > 0 else tau_neg
        loss_t = -f(rho_t) A_t
        gradient: -4 sigmoid'(tau (rho - 1)) rho A grad log pi  (= -A grad log pi at rho = 1)

    Reference: verl core_algos `compute_policy_loss_sapo` (actor tau_pos 1.0, tau_neg 1.05;
    verl forces seq-mean-token-mean aggregation); TRL `_compute_loss`, loss_type="sapo"
    (sapo_temperature_pos / _neg, aggregated like `grpo`): use loss_agg=seq_mean_token_mean
    to reproduce either. log rho clamped to [-20, 20] as in verl. `sapo/grad_weight_dev` is
    |4 sigmoid' rho - 1|, how far the gate moved a token's gradient from the plain one.
    """
    ratio = importance_ratio(logp, old_logp)
    tau = torch.where(advantages > 0, advantages.new_tensor(tau_pos), advantages.new_tensor(tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(gate * 4.0 / tau) * advantages
    with torch.no_grad():
        grad_weight = 4.0 * gate * (1.0 - gate) * ratio
        stats = {"sapo/grad_weight_dev": (grad_weight - 1.0).abs().expand_as(loss).to(logp.dtype)}
    return loss, stats


@register("clip", "gmpo",
          what="GMPO (arXiv 2507.20673): geometric mean of the token ratios, each clipped in log space to [-eps_low, "
               "eps_high] (verl loss_mode=geo_mean); aggregates as seq_mean_token_mean",
          notes={"eps_low": "verl's examples/gmpo_trainer",
                 "mean_over": "verl: the mean over all B rows (a fully masked row counts 0) | live: over non-empty "
                              "rows",
                 "is_weights": "token-level rollout IS weights per sequence, exp(mean log w) (verl) | token: each "
                               "its own"},
          off_policy_only=True, per_sequence_loss=True, sequence_ratio=True,
          knobs={**EPS, "mean_over": choice("all", "live")}, inert=ONE_STEP, activity=RATIO_MOVES,
          checks=one_forward_statistic("clip=gmpo's mean_over=all (the share of live rows)",
                                       unless=lambda cfg: cfg.clip.mean_over == "live"),
          tricks=(Trick("gmpo",
                        what="GMPO: geometric mean of the token ratios, clipped per token in log space",
                        source="verl loss_mode=geo_mean (arXiv 2507.20673)",
                        verdict="not_in_review"),))
def gmpo_loss(logp, old_logp, advantages, mask, *, eps_low: float = 0.4, eps_high: float = 0.4,
              mean_over: str = "all"):
    """GMPO (arXiv 2507.20673): the geometric mean of token ratios, clipped per token in log space.

        Delta'_t = sgn(A) min(sgn(A) Delta_t, sgn(A) clip(Delta_t, -eps_low, eps_high))
        rho_i = exp(mean_t Delta'_t),  A_i = mean_t A_t
        loss = (1/B) sum_i (-A_i rho_i)

    Reference: verl core_algos `compute_policy_loss_geo_mean` (loss_mode=geo_mean; torch.mean
    over all B sequences of the micro-batch, ignoring loss_agg_mode; no log-ratio clamp;
    defaults 0.4 from verl's examples/gmpo_trainer). Every token of sequence i carries the
    value -A_i rho_i (B_live / B): under loss_agg=seq_mean_token_mean, which averages over the
    B_live sequences with a trained token, that is verl's mean over all B, fully masked rows
    (the overlong filter makes them) counting as 0 (`mean_over=all`, verl's convention;
    `mean_over=live` averages over the non-empty rows only, the B / B_live larger loss). B is
    the rows this call sees (a mini-batch, or this rank's share of it, as verl's micro-batch).
    Token-level rollout importance weights (rollout_correction token_*) enter as their
    per-sequence geometric mean exp(mean_t log w_t), as in verl (flag per_sequence_loss; the
    trainer's setting clip.is_weights=token multiplies each token's loss by its own weight
    instead: sequence_is_weights below). Under any mode the gradient at rho = 1 is plain
    PPO-clip's. A clipped token has zero gradient; a token counts as clipped (clip/low_frac,
    clip/high_frac) when the clamp is the active branch.
    """
    mask = mask.to(logp.dtype)
    log_ratio = logp - old_logp
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(-eps_low, eps_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = mask.sum(dim=-1, keepdim=True)
    rho = torch.exp((pessimistic * mask).sum(dim=-1, keepdim=True) / (lengths + 1e-8))
    seq_advantage = (advantages * mask).sum(dim=-1, keepdim=True) / (lengths + 1e-8)
    loss = (-seq_advantage * rho).expand_as(logp)
    if mean_over == "all" and mask.shape[0]:
        live = (lengths > 0).sum().clamp(min=1).to(loss.dtype)
        loss = loss * (live / mask.shape[0])
    with torch.no_grad():
        stats = {"clip/low_frac": float_like((log_ratio < -eps_low) & (advantages < 0), loss),
                 "clip/high_frac": float_like((log_ratio > eps_high) & (advantages > 0), loss)}
    return loss, stats


def sequence_is_weights(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-level importance weights [N, T] as one weight per sequence [N, 1], their geometric
    mean over its trained tokens: exp(sum_t m_t log(w_t + 1e-10) / (sum_t m_t + 1e-8)) (verl
    compute_policy_loss_geo_mean's seq_is_weights; a weight a mask rule set to 0 pulls its
    sequence's weight to ~0)."""
    mask = mask.to(weights.dtype)
    return torch.exp((torch.log(weights + 1e-10) * mask).sum(dim=-1, keepdim=True)
                     / (mask.sum(dim=-1, keepdim=True) + 1e-8))


def _covariance(advantages, logp, mask) -> torch.Tensor:
    """Per-token (A_t - mean A)(log pi_t - mean log pi), means over the batch's trained tokens."""
    with torch.no_grad():
        advantages = advantages.expand_as(logp)
        n = mask.sum().clamp(min=1)
        return ((advantages - (advantages * mask).sum() / n)
                * (logp.detach() - (logp.detach() * mask).sum() / n))


@register("clip", "clip_cov",
          what="Clip-Cov (The Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617): PPO clip, and a random "
               "`ratio` of the tokens with cov_low < cov(A, log pi) < cov_high get no gradient (verl "
               "loss_mode=clip_cov)",
          notes={"ratio": "verl policy_loss.clip_cov_ratio",
                 "cov_low": "verl clip_cov_lb",
                 "cov_high": "verl clip_cov_ub"},
          knobs={**EPS, "ratio": Allowed(low=0, high=1, low_open=True), "cov_low": NUMBER, "cov_high": NUMBER},
          checks=(lambda cfg: None if cfg.clip.cov_low < cfg.clip.cov_high else (
              f"clip.cov_low={cfg.clip.cov_low} and clip.cov_high={cfg.clip.cov_high} leave an empty band; "
              "cov_low must be < cov_high"),
              one_forward_statistic("clip=clip_cov's covariance and its draw of tokens")),
          activity=Activity("clip_cov/frac"),
          writes=("clip/high_frac", "clip_cov/frac"),
          tricks=(Trick("clip_cov",
                        what="Clip-Cov: a random few high-covariance tokens lose their gradient",
                        source="verl loss_mode=clip_cov (arXiv 2505.22617)",
                        verdict="not_in_review"),))
def clip_cov_loss(logp, old_logp, advantages, mask, *, eps_low: float = 0.2, eps_high: float = 0.2,
                  ratio: float = 2e-4, cov_low: float = 1.0, cov_high: float = 5.0,
                  generator: torch.Generator | None = None):
    """Clip-Cov ("The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617): PPO clip,
    and a random few of the tokens with a large covariance lose their gradient.

        cov_t = (A_t - mean A)(log pi_t - mean log pi)   (over the batch's trained tokens)
        candidates: trained tokens with cov_low < cov_t < cov_high that PPO clip did not clip
        chosen: max(int(ratio * n_tokens), 1) of them, uniformly at random (all if fewer)
        loss_t = max(-rho A, -clip(rho) A) * (0 if chosen else 1)

    Reference: verl core_algos `compute_policy_loss_clip_cov` (policy_loss.clip_cov_ratio
    2e-4, clip_cov_lb 1.0, clip_cov_ub 5.0; no log-ratio clamp there, [-20, 20] here; its
    draw is torch.randperm on the global RNG, here on `generator`, which the trainer supplies
    seeded and checkpointed). Acts on-policy too (not off_policy_only). `clip_cov/frac` is
    the fraction of tokens chosen (verl's pg_clipfrac).
    """
    mask = mask.to(logp.dtype)
    rho = importance_ratio(logp, old_logp)
    unclipped, clipped = -advantages * rho, -advantages * rho.clamp(1.0 - eps_low, 1.0 + eps_high)
    with torch.no_grad():
        cov = _covariance(advantages, logp, mask)
        candidate = (cov > cov_low) & (cov < cov_high) & (mask > 0) & ~(clipped > unclipped)
        where = candidate.flatten().nonzero().squeeze(1)
        count = max(int(ratio * mask.sum().item()), 1)
        device = generator.device if generator is not None else "cpu"
        order = torch.randperm(len(where), generator=generator, device=device).to(where.device)
        keep = torch.ones(logp.numel(), dtype=logp.dtype, device=logp.device)
        keep[where[order[:count]]] = 0.0
        keep = keep.view_as(logp)
    loss = torch.maximum(unclipped, clipped) * keep
    stats = _clip_fractions(rho, advantages, 1.0 - eps_low, 1.0 + eps_high, loss)
    stats["clip_cov/frac"] = (1.0 - keep) * mask
    return loss, stats


@register("clip", "kl_cov",
          what="KL-Cov (arXiv 2505.22617): no clip; the top `ratio` of tokens by cov(A, log pi) get kl_coef |log pi -"
               " log pi_old| added (verl loss_mode=kl_cov)",
          notes={"ratio": "verl policy_loss.kl_cov_ratio", "kl_coef": "verl policy_loss.ppo_kl_coef"},
          off_policy_only=True,
          knobs={"ratio": Allowed(low=0, high=1, low_open=True), "kl_coef": NON_NEGATIVE},
          checks=one_forward_statistic("clip=kl_cov's covariance and its top tokens"),
          inert=ONE_STEP,
          activity=Activity("kl_cov/penalty"),
          writes=("kl_cov/frac",),
          tricks=(Trick("kl_cov",
                        what="KL-Cov: the top covariance tokens get a |log ratio| penalty, no clip",
                        source="verl loss_mode=kl_cov (arXiv 2505.22617)",
                        verdict="not_in_review"),))
def kl_cov_loss(logp, old_logp, advantages, mask, *, ratio: float = 2e-4, kl_coef: float = 0.1):
    """KL-Cov (arXiv 2505.22617): no clip; the tokens with the largest covariance get a KL penalty.

        cov_t as in clip_cov; chosen: the top max(1, int(ratio * n_tokens)) trained tokens by cov
        loss_t = -rho_t A_t + (kl_coef |Delta_t| if chosen else 0)

    Reference: verl core_algos `compute_policy_loss_kl_cov` (policy_loss.kl_cov_ratio 2e-4,
    ppo_kl_coef 0.1; no log-ratio clamp there, [-20, 20] here). On-policy Delta = 0 and
    d|x|/dx = 0 at 0, so the gradient is plain PPO's: off_policy_only. `kl_cov/frac` is the
    fraction chosen, `kl_cov/penalty` the penalty they carry (0 on-policy).
    """
    mask = mask.to(logp.dtype)
    log_ratio = logp - old_logp
    loss = -advantages * importance_ratio(logp, old_logp)
    with torch.no_grad():
        cov = _covariance(advantages, logp, mask).masked_fill(mask == 0, float("-inf"))
        valid = int(mask.sum().item())
        count = min(max(1, int(valid * ratio)), valid)
        chosen = torch.zeros(logp.numel(), dtype=logp.dtype, device=logp.device)
        chosen[torch.topk(cov.flatten(), count).indices] = 1.0
        chosen = chosen.view_as(logp)
    penalty = kl_coef * log_ratio.abs() * chosen
    loss = loss + penalty
    return loss, {"kl_cov/frac": chosen * mask, "kl_cov/penalty": penalty.detach()}


@register("clip", "gpg",
          what="GPG (arXiv 2504.02546): plain REINFORCE, -A log pi, no ratio and no clip (verl loss_mode=gpg); its "
               "advantage is adv=gpg",
          off_policy_only=True,
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          writes=("loss",),
          tricks=(Trick("gpg_loss",
                        what="GPG loss: plain -A log pi, no ratio, no clip (pair with gpg_advantage)",
                        source="verl loss_mode=gpg (arXiv 2504.02546)",
                        verdict="not_in_review"),))
def gpg_loss(logp, old_logp, advantages, mask):
    """GPG (Group Policy Gradient, arXiv 2504.02546): plain REINFORCE, no ratio and no clip.

        loss_t = -A_t log pi_t

    Reference: verl core_algos `compute_policy_loss_gpg` (loss_mode=gpg; with adv=gpg, the
    GPG advantage). Its gradient is PPO-clip's at rho = 1; off-policy it simply ignores the
    ratio, so it differs from PPO only with several optimizer steps per rollout.
    """
    return -advantages * logp, {}


# dual_clip: config only; ppo_clip_loss takes dual_clip.c as its supplied knob dual_clip_c
def _caps_a_ppo_clip_loss(cfg):
    if "dual_clip_c" in option("clip", cfg.clip.name).knobs:
        return None
    return (f"dual_clip={cfg.dual_clip.name} caps the PPO-clip loss, and clip={cfg.clip.name} has no dual clip; "
            "use clip=symmetric or clip=higher, or dual_clip=none")


declare("dual_clip", "none")
declare("dual_clip", "enabled", off_policy_only=True,   # caps rho A: rho == 1 never hits it
        activity=Activity("clip/dual_frac"), checks=_caps_a_ppo_clip_loss,
        inert=Inert(one_optimizer_step, "cannot act with one optimizer step per rollout (ρ ≡ 1 never exceeds c)",
                    "add updates.mini_batches=4", "several optimizer steps per rollout"),
        tricks=(Trick("dual_clip",
                      what="dual-clip PPO, c 3",
                      source="verl clip_ratio_c",
                      verdict="not_applicable"),))
