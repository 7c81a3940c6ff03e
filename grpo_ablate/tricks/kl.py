"""Family `kl`: per-token KL estimators toward the reference policy, and the beta controller.

With log r = log pi_ref - log pi_theta per token (Schulman, "Approximating KL Divergence"):
    k1 = -log r            unbiased; as a loss on on-policy samples its expected gradient is 0
    k2 = 0.5 (log r)^2     its gradient is the reverse-KL gradient
    k3 = (r - 1) - log r   unbiased and >= 0; its gradient is the forward-KL gradient
Reference: verl core_algos `kl_penalty` (kl / mse / low_var_kl); TRL `_compute_loss` uses k3.
log r is clamped to [-20, 20] before exp, as verl does.

Estimators of the recent references (option family `kl.estimator`, the key kl.estimator):
    abs      |log pi - log pi_ref|                                   (verl kl_loss_type "abs")
    k1_st    value of k1, gradient of k2: k2 - sg(k2) + sg(k1)       (verl "k1+")
    k3_st    value of k3, gradient of k2: k2 - sg(k2) + sg(k3)       (verl "k3+" and "low_var_kl+")
    k3_iw    k3 * rho, rho = exp(log pi - log pi_old), gradient through rho
             (TRL use_bias_correction_kl, its default since DeepSeek-V3.2)
The "+" of verl's names is not a plain Hydra override value, hence the _st suffix. verl's
"k3" / "low_var_kl" also clamp the value to [-10, 10]; k3 here does not (it changes only
values above 10, i.e. |log r| beyond about 2.6 from above).
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import no_kl_term
from grpo_ablate.tricks.registry import (NON_NEGATIVE, POSITIVE, SEED_REVIEW, Activity, Allowed, Claim, Inert, Trick,
                                         declare_family, options_of, register)

declare_family("kl", "KL to the frozen start; `none` has no reference model at all, `adaptive` a threshold, "
               "`adaptive_target` Ziegler/verl's controller, `in_reward` charges the reward (verl), `two_layer` "
               "adds a KL to the policy of `prev_lag` steps ago; `kl.estimator=k1|k2|k3|abs|k1_st|k3_st|k3_iw` "
               "(straight-through and importance-weighted too)", stage="loss", default="fixed", metric="kl/beta",
               settings={"estimator": options_of("kl.estimator")}, defaults={"estimator": "k3"})   # the per-token KL

# the rules of a KL term's options and estimators
NO_KL = Inert(no_kl_term, "cannot act with kl.beta=0", "set kl.beta > 0", "kl.beta > 0")
ESTIMATOR_WITHOUT_KL = Inert(no_kl_term, "only changes a logged metric: with kl.beta=0 there is no KL term or penalty",
                             "set kl.beta > 0", "a KL term or penalty (kl.beta > 0)")
GRADIENT_ONLY = Inert(lambda cfg: cfg.kl.name == "in_reward",
                      "changes only the KL's gradient, and a penalty in the reward has none (in the reward k1_st "
                      "is k1, k3_st and k3_iw are k3)",
                      "use a KL term in the loss (kl=fixed), or kl.estimator=k1|k3 in the reward",
                      "a KL term in the loss (not kl=in_reward)")

LOG_RATIO_LIMIT = 20.0


# Option family `kl.estimator` (the key kl.estimator of every kl option):
# (logp, ref_logp, old_logp) -> per token. old_logp (the rollout-time policy, no gradient) is
# read only by k3_iw; the trainer passes logp.detach() when it has no separate pi_old.
@register("kl.estimator", "k1",
          inert=ESTIMATOR_WITHOUT_KL)
def k1(logp, ref_logp, old_logp=None):
    return logp - ref_logp


@register("kl.estimator", "k2",
          inert=ESTIMATOR_WITHOUT_KL)
def k2(logp, ref_logp, old_logp=None):
    return 0.5 * (ref_logp - logp) ** 2


@register("kl.estimator", "k3",
          inert=ESTIMATOR_WITHOUT_KL)
def k3(logp, ref_logp, old_logp=None):
    log_r = (ref_logp - logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.exp(log_r) - 1.0 - log_r


@register("kl.estimator", "abs",
          inert=ESTIMATOR_WITHOUT_KL)
def abs_kl(logp, ref_logp, old_logp=None):
    """|log pi - log pi_ref| (verl kl_loss_type "abs"); its gradient is sign(log pi - log pi_ref)."""
    return (logp - ref_logp).abs()


def _straight_through(value: torch.Tensor, logp, ref_logp) -> torch.Tensor:
    """The value of `value`, the gradient of k2 (verl `kl_penalty` with a "+" suffix)."""
    gradient_carrier = k2(logp, ref_logp)
    return gradient_carrier - gradient_carrier.detach() + value.detach()


@register("kl.estimator", "k1_st",
          inert=(ESTIMATOR_WITHOUT_KL, GRADIENT_ONLY))
def k1_st(logp, ref_logp, old_logp=None):
    """Straight-through k1 (verl "k1+"): k1's value (unbiased), k2's gradient (the reverse KL's)."""
    return _straight_through(k1(logp, ref_logp), logp, ref_logp)


@register("kl.estimator", "k3_st",
          inert=(ESTIMATOR_WITHOUT_KL, GRADIENT_ONLY))
def k3_st(logp, ref_logp, old_logp=None):
    """Straight-through k3 (verl "k3+", "low_var_kl+"): k3's value, k2's gradient."""
    return _straight_through(k3(logp, ref_logp), logp, ref_logp)


@register("kl.estimator", "k3_iw",
          inert=(ESTIMATOR_WITHOUT_KL, GRADIENT_ONLY))
def k3_iw(logp, ref_logp, old_logp=None):
    """Importance-weighted k3 (TRL `use_bias_correction_kl`, default True): k3_t * rho_t with
    rho_t = exp(log pi_t - log pi_old_t), the gradient flowing through rho too. On-policy
    (rho == 1 in value) its gradient is (log pi - log pi_ref) grad log pi, k2's: the unbiased
    reverse-KL gradient; off-policy it is reweighted by rho. TRL's ratio is the loss's
    (token-level here; TRL broadcasts the sequence ratio with importance_sampling_level=
    sequence); log rho is clamped to [-20, 20] here, not in TRL."""
    old_logp = logp.detach() if old_logp is None else old_logp
    rho = torch.exp((logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    return k3(logp, ref_logp) * rho


@register("kl", "none",
          what="no KL term: no reference model is loaded or run",
          knobs={"beta": NON_NEGATIVE})
@register("kl", "fixed",
          what="loss += beta * KL(pi_theta || pi_ref) per token, aggregated like the policy loss",
          defaults={"beta": 0.04},
          notes={"estimator": "k1 | k2 | k3 (Schulman)"},
          knobs={"beta": NON_NEGATIVE},
          inert=NO_KL,
          tricks=(Trick("kl_fixed",
                        what="fixed KL penalty, beta 0.04, k3",
                        source="TRL beta; verl use_kl_loss",
                        verdict="baseline",
                        cost="a frozen reference model: +1 forward per step, +1 model in memory"),
                  Trick("kl_importance_weighted",
                        what="k3 KL multiplied by the importance ratio (gradient through it)",
                        source="TRL use_bias_correction_kl (its default; DeepSeek-V3.2)",
                        verdict="not_in_review", settings={"estimator": "k3_iw"},
                        cost="a frozen reference model: +1 forward per step, +1 model in memory"),
                  Trick("kl_straight_through",
                        what="k3 KL value with the k2 gradient (straight-through)",
                        source="verl kl_loss_type=k3+ (low_var_kl+)",
                        verdict="not_in_review", settings={"estimator": "k3_st"},
                        cost="a frozen reference model: +1 forward per step, +1 model in memory"),))
class FixedKL:
    """beta stays where the config put it (GRPO: 0.04; `kl=none` is beta 0, no reference).

    `loss_beta` weighs the KL term in the loss, `reward_beta` a KL penalty in the reward;
    a controller uses one of the two.
    """

    in_reward = False
    beta_prev, prev_lag = 0.0, 0      # no anchor to a previous policy (see TwoLayerKL)

    def __init__(self, *, beta: float = 0.0):
        self.beta = float(beta)

    @property
    def loss_beta(self) -> float:
        return 0.0 if self.in_reward else self.beta

    @property
    def reward_beta(self) -> float:
        return self.beta if self.in_reward else 0.0

    def update(self, measured_kl: float, num_sequences: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"beta": self.beta}

    def load_state_dict(self, state: dict) -> None:
        self.beta = float(state["beta"])


@register("kl", "adaptive",
          what="threshold-triggered KL (seed review): beta grows by `growth` while KL > threshold",
          notes={"decay": "> 0: decay back toward the starting beta while KL <= threshold"},
          knobs={"beta": NON_NEGATIVE, "threshold": POSITIVE, "growth": POSITIVE, "beta_max": POSITIVE,
                 "decay": NON_NEGATIVE},
          activity=Activity("kl/beta", "changes"),
          inert=NO_KL,
          tricks=(Trick("kl_adaptive",
                        what="beta grows while KL exceeds a threshold",
                        source="seed review",
                        verdict="recommended",
                        cost="a frozen reference model: +1 forward per step, +1 model in memory",
                        claims=(
                            Claim("helps", "", SEED_REVIEW,
                                  "adaptive (threshold) KL: medium gain, high stability (recommended)"),)),))
class ThresholdKL(FixedKL):
    """`adaptive` (seed review: threshold-triggered): beta rises only while the measured KL is
    above the threshold, beta <- min(beta (1 + growth), beta_max); otherwise it stays, or decays
    toward its start by `decay` per step (0 = stays). No framework has this exact rule."""

    def __init__(self, *, beta: float = 0.04, threshold: float = 0.02, growth: float = 0.1,
                 beta_max: float = 1.0, decay: float = 0.0):
        super().__init__(beta=beta)
        self.start, self.threshold, self.growth = float(beta), float(threshold), float(growth)
        self.beta_max, self.decay = float(beta_max), float(decay)

    def update(self, measured_kl: float, num_sequences: int) -> None:
        if measured_kl > self.threshold:
            self.beta = min(self.beta * (1 + self.growth), self.beta_max)
        elif self.decay > 0:
            self.beta = max(self.start, self.beta * (1 - self.decay))


@register("kl", "adaptive_target",
          what="Ziegler / verl AdaptiveKLController: proportional control of beta toward a target KL",
          knobs={"beta": NON_NEGATIVE, "target": POSITIVE, "horizon": POSITIVE},
          activity=Activity("kl/beta", "changes"),
          inert=NO_KL,
          tricks=(Trick("kl_adaptive_target",
                        what="proportional control of beta toward a target KL",
                        source="verl AdaptiveKLController",
                        verdict="not_applicable",
                        cost="a frozen reference model: +1 forward per step, +1 model in memory"),))
class TargetKL(FixedKL):
    """`adaptive_target` (Ziegler et al.; verl `AdaptiveKLController`): proportional control
    toward a target KL, e = clip(KL / target - 1, -0.2, 0.2), beta <- beta (1 + e n / horizon),
    n = sequences in the step."""

    def __init__(self, *, beta: float = 0.04, target: float = 0.02, horizon: int = 10000):
        super().__init__(beta=beta)
        self.target, self.horizon = float(target), int(horizon)

    def update(self, measured_kl: float, num_sequences: int) -> None:
        error = min(max(measured_kl / self.target - 1.0, -0.2), 0.2)
        self.beta *= 1.0 + error * num_sequences / self.horizon


def charges_the_reward(values) -> bool:
    """kl=in_reward's penalty is charged on pi_old's log-probs, a forward of its own; at beta 0 nothing is charged."""
    return float(values["beta"]) > 0


@register("kl", "in_reward",
          what="verl use_kl_in_reward: r <- r - beta * sum_t KL_t (sampling policy vs reference), no KL in the loss",
          defaults={"beta": 0.04, "estimator": "k1"},
          notes={"estimator": "the KL charged to the reward (verl algorithm.kl_penalty, default \"kl\" = k1)"},
          shapes_reward=True, needs_old_forward=charges_the_reward,
          knobs={"beta": NON_NEGATIVE},
          inert=NO_KL,
          writes=("kl/beta", "kl/k1"),
          tricks=(Trick("kl_in_reward",
                        what="KL penalty in the reward instead of the loss",
                        source="verl algorithm.use_kl_in_reward",
                        verdict="not_applicable",
                        cost="a frozen reference model and a pi_old forward: +2 forwards per step"),))
class InRewardKL(FixedKL):
    """`in_reward` (verl `use_kl_in_reward`): r_j <- r_j - beta * sum_t KL_t, with KL_t from the
    sampling policy's log-probs (no gradient), before the advantage; no KL term in the loss.
    `kl_reward_penalty` computes it with any kl.estimator (verl: every kl_penalty type)."""

    in_reward = True


@register("kl", "two_layer",
          what="two-layer KL (seed review): anchors to pi_ref and to the policy of prev_lag steps ago",
          defaults={"prev_lag": 2},
          notes={"prev_lag": "with 1 update per rollout, lag 1 would be pi_old itself only one step back"},
          knobs={"beta": NON_NEGATIVE, "beta_prev": NON_NEGATIVE, "prev_lag": Allowed("integer", low=1)},
          activity=Activity("kl/prev_k3"),
          inert=NO_KL,
          writes=("kl/beta", "kl/prev_k3"),
          tricks=(Trick("kl_two_layer",
                        what="KL to the reference and to the policy of a few steps ago",
                        source="seed review, paper 3 (no framework has it)",
                        verdict="use_with_care",
                        cost="two frozen models: +2 forwards per step, +2 models and prev_lag weight snapshots in "
                             "memory",
                        claims=(
                            Claim("does not hurt", "", SEED_REVIEW,
                                  "two-layer KL: low gain, high stability, hard to get right (use with care)"),)),))
class TwoLayerKL(FixedKL):
    """`two_layer` (seed review, paper 3): loss += beta KL(pi || pi_ref) + beta_prev KL(pi || pi_prev),
    pi_prev = the policy as it was `prev_lag` optimizer steps before the current weights, a
    frozen snapshot (the trainer keeps it). No framework has it; ROLL's `kimi15` (a k2 anchor to
    pi_old) plus a KL loss is the nearest."""

    def __init__(self, *, beta: float = 0.04, beta_prev: float = 0.04, prev_lag: int = 1):
        super().__init__(beta=beta)
        self.beta_prev, self.prev_lag = float(beta_prev), int(prev_lag)


def kl_reward_penalty(old_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
                      estimator=k1) -> torch.Tensor:
    """sum_t KL_t per completion: the sequence-level KL estimate charged to its reward, with the
    chosen kl.estimator (a function of the family `kl.estimator`; verl `apply_kl_penalty` takes
    algorithm.kl_penalty, default "kl" = k1, which stays the default here). The rollout-time
    log-probs are both the policy's and pi_old's (no gradient: rho == 1 for k3_iw)."""
    return (estimator(old_logp, ref_logp, old_logp) * mask).sum(dim=1)
