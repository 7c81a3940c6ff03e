"""Family `score_centering`: the drift that group centering leaves when the sampler q is not the
trainer p, removed per token from the sampler's top-k head (Marek & Ryabinin 2026, "Score Centering
Stabilizes Off-policy Reinforcement Learning", arXiv 2609.20807).

At a prefix the policy gradient from samples of q is E_q[A s] = E_q[A] E_q[s] + Cov_q(A, s), s =
grad log p. E_q[s] is 0 only when q = p, and group centering makes E[A] zero over whole
completions, not at every prefix: the first term drifts the trainer toward the sampler. Score
centering subtracts the sampler-expected score, so the step is -A (w_y s_y - sum_v q_v w_v s_v),
whose expectation under q has no E_q[A] term. q is known only on the sampler's top-k head H (its
log-probs, over the full vocabulary, for the k most probable ids); outside it q is modelled as p
rescaled to q's tail mass, and sum_v p_v s_v = 0 folds that tail into the head.

Every option takes (head_logp, sampler_head_logp, mask) -- the trainer's log-probs of the head ids
[N, T, k] (with gradient: the only input the gradient flows through), the sampler's of the same ids
[N, T, k] (-inf for an id the sampler could not draw) and the trained tokens [N, T] -- and the
weight rule `weight` (ratio -> weight) that rollout_correction applies to the sampled token,
supplied by the trainer (None: 1). It returns (c [N, T], per-token statistics [N, T]): the loss
adds A_t * c_t to the policy term (train/losses.py), times the same token masks (token_mask,
off_policy_mask), never times rollout_correction's weight (w is inside c).
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import same_sampler_and_trainer
from grpo_ablate.tricks.registry import (POSITIVE, Activity, Allowed, Claim, Inert, Trick, declare_family, option,
                                         register)

declare_family("score_centering", "the sampler-expected score subtracted per token over the sampler's top-k head "
               "(score centering): removes the drift E_q[A] E_q[grad log p] of a sampler q that is not the trainer; "
               "composes with rollout_correction's per-token weights", stage="loss",
               metric="score_centering/residual_l1", neutral="none",
               supplied={"weight": "the trainer: rollout_correction's per-token weight rule (train/losses.py)"})

PAPER = "Marek & Ryabinin 2026, Score Centering Stabilizes Off-policy RL (arXiv 2609.20807)"


@register("score_centering", "none", what="no centering: the policy gradient keeps the sampler's expected score")
def no_score_centering(head_logp, sampler_head_logp, mask, *, weight=None):
    return torch.zeros_like(mask, dtype=head_logp.dtype), {}


def weight_rule(correction_fn):
    """ratio -> weight: rollout_correction's bound per-token option (its weights of log-ratios
    against 0) as a function of the ratio, so the head ids are weighed by the rule that weighs the
    sampled token; None (no correction): None, w = 1. Only options that weigh each token by its own
    ratio (`weighs_each_token`) have one: the checks refuse the others."""
    if correction_fn is None:
        return None

    def weight(ratio):
        flat = ratio.reshape(-1, ratio.shape[-1])
        return correction_fn(flat.log(), torch.zeros_like(flat), torch.ones_like(flat))[0].reshape(ratio.shape)
    return weight


def _composes(cfg):
    """rollout_correction's weight must be a function of each token's own ratio, w(p/q), to be
    applied to every head id and to the modelled tail (verl refuses other levels, vime other callbacks)."""
    chosen = cfg.get("rollout_correction")
    if chosen is None:
        return None
    correction = option("rollout_correction", chosen.name)
    if correction.needs_sampler_logprobs and not correction.weighs_each_token:
        return (f"score_centering composes only with a per-token rollout_correction (a weight of each token's own "
                f"ratio); rollout_correction={chosen.name} is not one")
    if chosen.get("renormalize"):
        return ("score_centering cannot take rollout_correction.renormalize=true: a batch-mean factor is not a "
                "function of each token's ratio")
    return None


SAMPLER_IS_TRAINER = Inert(same_sampler_and_trainer, "cannot act when the sampler is the trainer itself (same model, "
                           "same dtype, no staleness): q = p on the head, rho = 1, every residual q w - alpha p is 0",
                           "sample with rollout.dtype=bfloat16 (or rollout=vllm in another dtype, or staleness=fixed)",
                           "a sampler that differs from the trainer (bf16, vLLM, stale rollouts)")


@register("score_centering", "top_k",
          what="score centering: A * sum_{a in H} sg[q(a) w(p/q) - alpha p(a)] log p(a) added to the policy loss "
               "over the sampler's top-k head H, alpha = rho w(1/rho), rho = (1 - q_H) / (1 - p_H)",
          notes={"k": "the sampler's head size (SkyRL #2244's 32; vime's lab 128; capped at the vocabulary)",
                 "eps": "floor of the tail masses in rho (the paper's appendix A.3, every implementation's 1e-6)"},
          knobs={"k": Allowed("integer", low=1, high=4096), "eps": POSITIVE},
          reads_sampler_head=lambda values: int(values["k"]),
          activity=Activity("score_centering/residual_l1"), inert=SAMPLER_IS_TRAINER, checks=_composes,
          tricks=Trick("score_centering",
                       what="subtract the sampler-expected score per token over the sampler's top-32 head (the tail "
                            "modelled as the trainer's, rescaled): no E_q[A] E_q[grad log p] drift from a mismatched "
                            "sampler",
                       source="arXiv 2609.20807; SkyRL #2244 (trainer.algorithm.score_centering), miles #3317; "
                              "verl score_centering.py (verl-project/verl c6236f51), vime utils/score_centering.py "
                              "(vllm-project/vime 2b83ea20)",
                       verdict="not_in_review", cost="the sampler's top-k log-probs per token; a gather of k log-probs "
                                                     "from the loss forward's log-softmax",
                       claims=(Claim("helps", "", PAPER,
                                     "removing the drift term stabilises off-policy training under a training-"
                                     "inference mismatch, without importance ratios, masks or clipping"),)))
def score_centering_term(head_logp, sampler_head_logp, mask, *, weight=None, k: int = 32, eps: float = 1e-6):
    """Score centering over the sampler's top-k head (arXiv 2609.20807, eqs. 9, 12, 14):

        p_a, q_a  the trainer's and the sampler's probabilities of head id a (full-vocabulary mass)
        p_H = sum_H p,  q_H = sum_H q,   rho = max(1 - q_H, eps) / max(1 - p_H, eps)
        alpha = rho * w(1 / rho)
        r_a = q_a * w(p_a / q_a) - alpha * p_a                 (no gradient)
        c   = sum_{a in H} r_a * log p_a                        (the gradient through log p only)

    and the loss gains A * c, so that its gradient is -A (w_y s_y - sum_H r_a s_a): the sampled
    token's weighted score minus the sampler-expected one, E_q of which is 0 when H covers the
    vocabulary, for any w. The tail: q outside H is modelled as alpha' p with alpha' = rho, where the
    ratio p / q is 1 / rho, and sum_v p_v s_v = 0 moves its contribution onto the head as
    -rho w(1/rho) p_a. w is rollout_correction's per-token rule (TIS: min(r, high); IcePop: r inside
    [low, high], else 0; none: 1). p is the trainer's probability at this forward (detached), as in
    every source.

    Sources, and what was decided where they differ. SkyRL #2244 and miles #3317 were read in their
    descriptions (2026-09-19 and 09-18, SkyRL's validation notes too: k = 32, composed with geometric
    masking); neither branch was in the code index, so the formula follows the implementations read in
    full, verl-project/verl c6236f51 (`verl/trainer/ppo/score_centering.py`) and vllm-project/vime
    2b83ea20 (`vime/utils/score_centering.py`, the miles lineage's, `--use-tis` TIS / icepop): both
    agree with the paper's eq. 14 on r and alpha, floor both tail masses at eps = 1e-6 (appendix A.3)
    and keep rho the ratio of the floored masses where the head spans the vocabulary: then q = p gives
    rho = 1 and r = 0 exactly. Followed. A later revision of the verl file (in a fork) sets alpha = 0
    where 1 - p_H <= eps: the same gradient (alpha's part is alpha grad p_H, 0 when p_H = 1) but r = q
    there, so the residual would no longer show q = p: not followed. A head id the sampler could not
    draw (log q = -inf: a filtering sampler) adds nothing. The composition: w on every head id and on
    the tail is the token-level TIS / IcePop rule (verl's `score_centering_weight_fn` refuses other
    levels, vime other callbacks); SkyRL's sequence-level geometric mask multiplies the whole term
    instead: here a sequence-level or batch-renormalised rollout_correction is refused. The loss:
    REINFORCE's in vime (verl: its bypass-mode PPO); here the `clip` family's, exact when the ratio is 1
    (one optimizer step per rollout, this project's default); with PPO mini-batches the term is added
    whether the clip is active or not.
    Statistics per token: the residual's L1 mass sum_H |r_a| (0 when q = p), the head masses q_H, p_H,
    and alpha. Hand case (tests/test_score_centering.py): vocabulary 4, head {0, 1}."""
    with torch.no_grad():
        p, q = head_logp.detach().exp(), sampler_head_logp.exp()
        p_mass, q_mass = p.sum(dim=-1), q.sum(dim=-1)
        rho = (1.0 - q_mass).clamp(min=eps) / (1.0 - p_mass).clamp(min=eps)
        alpha = rho * (weight(1.0 / rho.unsqueeze(-1)).squeeze(-1) if weight is not None else 1.0)
        ratio = torch.exp((head_logp.detach() - sampler_head_logp).clamp(-20.0, 20.0))
        w = weight(ratio) if weight is not None else torch.ones_like(ratio)
        drawable = torch.isfinite(sampler_head_logp) & torch.isfinite(head_logp.detach())
        residual = torch.where(drawable, q * w - alpha.unsqueeze(-1) * p, torch.zeros_like(p))
        mask = mask.to(head_logp.dtype)
    finite_logp = torch.where(drawable, head_logp, torch.zeros_like(head_logp))
    centering = (residual * finite_logp).sum(dim=-1) * mask
    stats = {"score_centering/residual_l1": residual.abs().sum(dim=-1) * mask,
             "score_centering/sampler_head_mass": q_mass * mask,
             "score_centering/train_head_mass": p_mass * mask,
             "score_centering/alpha": alpha * mask}
    return centering, stats
