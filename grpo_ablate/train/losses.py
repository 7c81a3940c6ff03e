"""The loss of a GRPO step, written once: per-token terms by name, then one aggregation.

    policy    the policy loss of the `clip` family         kl_prev   beta_prev * KL(pi || pi_prev)
    value     value_coef * the critic's loss (adv=gae)     entropy   -c * H, while c > 0
    kl        beta * KL(pi || pi_ref) per token (`kl.estimator`), weighted by `kl_weight`

The policy term's tokens are weighed by token_mask x off_policy_mask x rollout_correction (each 1
when off), and score_centering adds A * c to it (c from the sampler's top-k head, times the token
masks: rollout_correction's weight is inside c); the aggregation weights stay the full mask's. The update minimizes
sum_jt w_jt * (sum of the terms), w the `loss_agg` weights; the gradient-conflict diagnostics
differentiate each term alone. Both call `LossTerms`, so a term added here is in both.
Design: docs/design.md, "How a step works" (4, update).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Mapping

import torch

from grpo_ablate.sampling.decode import derived_seed
from grpo_ablate.config.spec import BoundOption
from grpo_ablate.tricks.behaviour import known_or
from grpo_ablate.tricks.clip.sequence import sequence_is_weights
from grpo_ablate.tricks.score_centering import weight_rule


@dataclass
class LossInputs:
    """What the loss needs besides the forward's outputs: per-row tensors of the batch (or of
    some of its rows). None where the run has no such anchor."""
    mask: torch.Tensor                      # [N, T] the trained tokens
    advantages: torch.Tensor                # [N, 1] per completion or [N, T] per token
    old_logp: torch.Tensor | None = None    # pi_old (None: pi_old is the policy itself, rho = 1)
    ref_logp: torch.Tensor | None = None    # pi_ref, the frozen start
    prev_logp: torch.Tensor | None = None   # pi_prev, the policy prev_lag steps ago (two-layer KL)
    old_values: torch.Tensor | None = None  # V_old, the critic before this rollout's updates
    returns: torch.Tensor | None = None     # the critic's targets
    sampler_logp: torch.Tensor | None = None  # the sampler's own log-probs (rollout=hf records them; vLLM)
    is_weights: torch.Tensor | None = None  # rollout_correction's weights of the policy loss (None: all 1)
    sampler_head: torch.Tensor | None = None  # [N, T, k] the sampler's log-probs of its top-k ids (score_centering)
    token_keep: torch.Tensor | None = None  # token_mask's kept tokens, chosen over more rows than these
                                            # (the diagnostics' sub-batch takes the update's, over the batch)
    # a policy loss that centres on pi_old's top-K (clip=local; None: pi_old is the policy itself, and the
    # update's forward gives its own): pi_old's centred log-probs psi_old [N, T], its top-K ids and pbar [N, T, K]
    old_centred: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_pbar: torch.Tensor | None = None
    topk_mass: torch.Tensor | None = None   # [N, T] what pi_old's top-K holds of pi_old

    def rows(self, index) -> "LossInputs":
        """The same inputs for some rows (a slice or an index tensor)."""
        return LossInputs(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[index]
                             for f in fields(self)})


@dataclass(frozen=True)
class Coefficients:
    """This step's weights of the terms (adaptive controllers change them between steps); a term
    no plugin weighs is off."""
    kl: float = 0.0          # beta of the KL term in the loss (0: no term; kl=in_reward charges the reward)
    kl_prev: float = 0.0     # beta_prev of the two-layer KL
    entropy: float = 0.0     # c of the entropy bonus
    value: float = 0.0       # value_coef of the critic's loss
    kl_reward: float = 0.0   # beta of kl=in_reward's penalty in the reward (read once: it stays fixed)


class SeededDraws:
    """The random draws of a loss trick (clip_cov's choice of tokens): a generator seeded from
    the run's seed, owned by the trainer and checkpointed with it, so a resumed run draws what
    the uninterrupted one would."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(derived_seed(seed, ("loss_draws",)))

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    @contextmanager
    def unchanged(self):
        """Draws made inside (the diagnostics' extra loss) leave the update's draws as they were."""
        state = self.generator.get_state()
        try:
            yield
        finally:
            self.generator.set_state(state)


def loss_draws(clip: BoundOption, seed: int) -> SeededDraws | None:
    """The run's SeededDraws when its policy loss (`clip`) draws at random (takes a `generator`), else None."""
    return SeededDraws(seed) if "generator" in clip.option.knobs else None


def _over_ranks(select, spread, *tensors):
    """`select` over the whole mini-batch's rows (every rank's: a batch-wide statistic, as TRL
    gathers before its quantile), this rank's rows returned. spread: the DataParallel, or None."""
    if spread is None or spread.world == 1:
        return select(*tensors)
    everything = select(*(spread.gather_rows(t) for t in tensors))
    return everything[spread.share(len(everything))]


class LossTerms:
    """The loss tricks of a run, bound once; called with a forward's outputs and LossInputs.
    `tricks`: the run's bound options by family (RunSpec.tricks); the loss reads clip, dual_clip,
    kl.estimator, kl_weight, value_clip, token_mask, off_policy_mask, proximal and rollout_correction."""

    def __init__(self, tricks: Mapping[str, BoundOption], draws: SeededDraws | None = None):
        generator = draws.generator if draws is not None else None
        clip, token_mask, off_policy_mask = tricks["clip"], tricks["token_mask"], tricks["off_policy_mask"]
        self.policy_loss = clip.bind(dual_clip_c=tricks["dual_clip"].values["c"], generator=generator)
        self.kl_estimator = tricks["kl.estimator"].fn
        self.kl_weight = tricks["kl_weight"].fn
        self.value_loss = tricks["value_clip"].fn
        # the policy term's token factors, by the options' flags (None: the option keeps every token)
        self.token_mask = token_mask.fn if token_mask.option.selects_tokens else None
        self.off_policy_mask = off_policy_mask.fn if off_policy_mask.option.needs_sampler_logprobs else None
        # a per-sequence policy loss (gmpo) takes token-level importance weights per sequence (verl), unless
        # clip.is_weights=token
        self.sequence_is_weights = (clip.option.per_sequence_loss
                                    and clip.values.get("is_weights", "geometric") == "geometric")
        # proximal=train_logp (AReaL reuse_train_logp): the ratio's denominator is this forward's own log-probs
        self.reuses_train_logp = tricks["proximal"].option.reuses_train_logp
        # a policy loss anchored on the sampler (clip=cispo_rollout, SkyRL cispo_anchor=rollout; the combined-ratio
        # corrections, TRL AsyncGRPO): its ratio's denominator is mu's log-probs; the other terms keep pi_old
        correction = tricks["rollout_correction"]
        self.ratio_on_sampler = clip.option.ratio_on_sampler or correction.option.ratio_on_sampler
        # a rollout_correction on the current policy's ratio pi_theta / mu (`reads_current_policy`): its gate is
        # this forward's, so it is computed here, not once per rollout (None: the weights come in LossInputs)
        self.current_ratio_gate = correction.fn if correction.option.reads_current_policy else None
        # a policy loss that regresses centred log-probs (clip=local): it takes psi_theta and psi_old, not log-probs
        self.centres = clip.option.centres_on_old_topk
        # score_centering: the centering term from the sampler's head, its ids weighed by rollout_correction's
        # per-token rule (None: the option reads no head, no term)
        centering = tricks["score_centering"]
        self.reads_sampler_head = centering.has("reads_sampler_head")
        self.score_centering = (centering.bind(weight=weight_rule(correction.fn if correction.option.weighs_each_token
                                                                  else None))
                                if self.reads_sampler_head else None)

    def policy(self, logp, old_logp, advantages, mask, factor=None, sampler_logp=None):
        """(per-token policy loss, per-token clip statistics); old_logp None: rho = 1. `factor`:
        policy_factor's weights of the tokens (None: 1). A loss anchored on the sampler takes
        sampler_logp as its denominator (an unknown value, or none recorded: old_logp's)."""
        anchor = logp.detach() if old_logp is None else old_logp
        if self.ratio_on_sampler and sampler_logp is not None:
            anchor = known_or(sampler_logp, anchor)
        loss, stats = self.policy_loss(logp, anchor, advantages, mask)
        return (loss if factor is None else loss * factor), stats

    def token_keep(self, entropy, mask, spread=None):
        """token_mask's kept tokens [N, T] of these rows, the entropy quantile taken over them (and
        every rank's); None when the option keeps every token. The one source of the mask: the
        update calls it on each mini-batch, the diagnostics on the whole batch."""
        if self.token_mask is None:
            return None
        return _over_ranks(self.token_mask, spread, entropy.detach(), mask)

    def policy_factor(self, logp, entropy, inputs: LossInputs, spread=None):
        """(the per-token factor of the policy loss or None when it is 1, its statistics):
        token_mask's kept tokens (inputs.token_keep, else token_keep over these rows),
        off_policy_mask's kept sequences (the sampler's log-probs against this forward's; pi_old's
        without them) and rollout_correction's importance weights (or its gate on this forward's
        pi_theta / mu, for an option that `reads_current_policy`), multiplied."""
        masks, stats = self.token_masks(logp, entropy, inputs, spread)
        gate = None
        if self.current_ratio_gate is not None and inputs.sampler_logp is not None:
            gate, gate_stats = self.current_ratio_gate(logp.detach(), inputs.sampler_logp, inputs.mask)
            stats.update(gate_stats)
        return self.weighed(masks, inputs, gate), stats

    def weighed(self, masks, inputs: LossInputs, gate=None):
        """The token masks (or None) times rollout_correction's weights (or its current-ratio gate `gate`):
        the policy loss's factor."""
        weights = None
        if inputs.is_weights is not None:
            weights = (sequence_is_weights(inputs.is_weights, inputs.mask) if self.sequence_is_weights
                       else inputs.is_weights)
        return _product([f for f in (masks, weights, gate) if f is not None])

    def token_masks(self, logp, entropy, inputs: LossInputs, spread=None):
        """(token_mask's and off_policy_mask's kept tokens multiplied, or None when both keep every
        token; their statistics): the policy factor without rollout_correction's weights."""
        factors, stats = [], {}
        if self.token_mask is not None:
            keep = inputs.token_keep if inputs.token_keep is not None else self.token_keep(entropy, inputs.mask, spread)
            stats["token_mask/dropped_frac"] = inputs.mask - keep
            factors.append(keep)
        if self.off_policy_mask is not None:
            behaviour = inputs.sampler_logp if inputs.sampler_logp is not None else inputs.old_logp
            keep = self.off_policy_mask(logp.detach(), logp.detach() if behaviour is None else behaviour,
                                        inputs.advantages, inputs.mask)
            stats["off_policy_mask/dropped_frac"] = inputs.mask - keep
            factors.append(keep)
        return _product(factors), stats

    def centering(self, head_logp, masks, inputs: LossInputs):
        """(score_centering's per-token loss A * c [N, T] times the token masks `masks`, its statistics)."""
        if head_logp is None or inputs.sampler_head is None:
            raise RuntimeError("score_centering reads the sampler's top-k head, but the batch carries none")
        centering, stats = self.score_centering(head_logp, inputs.sampler_head.to(head_logp.device), inputs.mask)
        term = inputs.advantages * centering
        return (term if masks is None else term * masks), stats

    def __call__(self, logp, entropy, values, inputs: LossInputs, coef: Coefficients, spread=None, centred=None,
                 head_logp=None):
        """({term name: per-token loss [N, T]}, {metric name: per-token statistic}). The raw
        critic loss is a statistic too (`value/loss`), before value_coef weighs it. spread: the
        DataParallel whose ranks share the mini-batch (None: one process has all its rows).
        centred: this forward's centred log-probs psi_theta, for a policy loss that regresses them
        (clip=local); its psi_old is pi_old's (inputs.old_centred), else psi_theta's, detached.
        head_logp: this forward's log-probs of the sampler's head ids [N, T, k] (score_centering)."""
        old_logp = logp.detach() if inputs.old_logp is None else inputs.old_logp
        gap = None
        if self.reuses_train_logp:   # how far pi_old is from the pi_prox used, then pi_prox = pi_theta.detach()
            gap, old_logp = (logp.detach() - old_logp).abs(), logp.detach()
        factor, factor_stats = self.policy_factor(logp, entropy, inputs, spread)
        if self.centres:   # every other term and factor keeps the log-probs
            if centred is None:
                raise ValueError("the policy loss regresses centred log-probs: the forward must give them (topk)")
            policy, stats = self.policy(centred, centred.detach() if inputs.old_centred is None else inputs.old_centred,
                                        inputs.advantages, inputs.mask, factor)
        else:
            policy, stats = self.policy(logp, old_logp, inputs.advantages, inputs.mask, factor, inputs.sampler_logp)
        stats.update(factor_stats)
        if self.score_centering is not None:   # part of the policy term: the diagnostics' policy gradient has it
            # the token masks again, without the weights (only with score_centering on)
            centering, centered = self.centering(head_logp, self.token_masks(logp, entropy, inputs, spread)[0], inputs)
            policy = policy + centering
            stats.update(centered)
        if gap is not None:
            stats["proximal/train_logp_gap"] = gap
        terms = {"policy": policy}
        if values is not None:
            stats["value/loss"] = self.value_loss(values, inputs.old_values, inputs.returns)
            terms["value"] = coef.value * stats["value/loss"]
        if inputs.ref_logp is not None and coef.kl > 0:
            kl = self.kl_estimator(logp, inputs.ref_logp, old_logp)
            terms["kl"] = coef.kl * (kl * self.kl_weight(inputs.mask, entropy))
        if inputs.prev_logp is not None and coef.kl_prev > 0:
            terms["kl_prev"] = coef.kl_prev * self.kl_estimator(logp, inputs.prev_logp, old_logp)
        if coef.entropy > 0:   # the entropy carries a gradient only then
            terms["entropy"] = -coef.entropy * entropy
        return terms, stats


def _product(factors: list):
    """The factors multiplied in their order; None for none."""
    out = None
    for factor in factors:
        out = factor if out is None else out * factor
    return out


def total(terms: dict) -> torch.Tensor:
    """The per-token loss: the terms added in their order (policy first)."""
    values = iter(terms.values())
    out = next(values)
    for term in values:
        out = out + term
    return out
