"""Family `entropy`: an entropy bonus in the loss, loss -= c * H, H over the full vocabulary of
the tempered logits, aggregated like the policy loss.

`bonus`: a fixed c (0.001). `adaptive` (seed review "entropy adaptive coefficient"; TRL
`use_adaptive_entropy`, from Skywork-OR1): after each step, if the measured entropy
H <= H_target then c <- min(c + delta, c_max) else c <- max(c - delta, c_min); the bonus
applies only while the last measured H <= H_target. H_target = 0.2 nats is the Skywork
default for LLM vocabularies; a character-level model sits far lower, so pick it per task.
"""
from __future__ import annotations

from grpo_ablate.tricks.registry import (NON_NEGATIVE, POSITIVE, SEED_REVIEW, Activity, Claim, Inert, Trick,
                                         declare_family, register)

declare_family("entropy", "entropy bonus, fixed or Skywork-OR1 adaptive coefficient",
               stage="loss", metric="entropy/coef")


@register("entropy", "none",
          what="no entropy term (no entropy gradient is computed)",
          knobs={"coef": NON_NEGATIVE},
          checks=lambda cfg: None if cfg.entropy.coef == 0 else (
              f"entropy.coef={cfg.entropy.coef} with entropy=none would add an entropy term anyway; "
              "use entropy=bonus (fixed) or entropy=adaptive"))
@register("entropy", "bonus",
          what="loss -= coef * entropy, aggregated like the policy loss",
          defaults={"coef": 0.001},
          knobs={"coef": NON_NEGATIVE},
          activity=Activity("entropy/coef"),
          inert=Inert(lambda cfg: float(cfg.entropy.coef) == 0, "cannot act with entropy.coef=0",
                      "set entropy.coef > 0", "entropy.coef > 0"),
          tricks=(Trick("entropy_bonus",
                        what="fixed entropy bonus 0.001",
                        source="verl entropy_coeff",
                        verdict="not_applicable",
                        cost="entropy gradient through the full-vocabulary softmax"),))
class FixedEntropyBonus:
    """c stays where the config put it (`entropy=none` is c = 0: no entropy gradient at all)."""

    def __init__(self, *, coef: float = 0.0):
        self.coef = float(coef)

    def update(self, measured_entropy: float) -> None:
        pass

    def state_dict(self) -> dict:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict) -> None:
        self.coef = float(state["coef"])


@register("entropy", "adaptive",
          what="Skywork-OR1 adaptive entropy: coef rises by delta while entropy <= target, falls otherwise; the bonus"
               " applies only while the last measured entropy is <= target. The default target (0.2 nats, for LLM "
               "vocabularies) is far above this task's character-level entropy.",
          knobs={"coef": NON_NEGATIVE, "target": NON_NEGATIVE, "delta": POSITIVE, "coef_min": NON_NEGATIVE,
                 "coef_max": NON_NEGATIVE},
          activity=Activity("entropy/coef"),
          inert=Inert(lambda cfg: float(cfg.entropy.coef_max) == 0,
                      "cannot act with entropy.coef_max=0 (the coefficient never rises above 0)",
                      "set entropy.coef_max > 0", "entropy.coef_max > 0 and H below entropy.target"),
          tricks=(Trick("entropy_adaptive",
                        what="adaptive entropy coefficient",
                        source="TRL use_adaptive_entropy (Skywork-OR1)",
                        verdict="recommended",
                        cost="entropy gradient through the full-vocabulary softmax while active",
                        claims=(
                            Claim("does not hurt", "", SEED_REVIEW,
                                  "an adaptive entropy coefficient: low gain, high stability (recommended)"),)),))
class AdaptiveEntropyBonus:
    def __init__(self, *, coef: float = 0.0, target: float = 0.2, delta: float = 0.005,
                 coef_min: float = 0.0, coef_max: float = 1.0):
        self.base, self.target, self.delta = float(coef), float(target), float(delta)
        self.coef_min, self.coef_max = float(coef_min), float(coef_max)
        self.level = self.base      # the adapted coefficient
        self.active = True          # last measured H <= target (no measurement yet: apply)

    @property
    def coef(self) -> float:
        return self.level if self.active else 0.0

    def update(self, measured_entropy: float) -> None:
        self.active = measured_entropy <= self.target
        step = self.delta if self.active else -self.delta
        self.level = min(max(self.level + step, self.coef_min), self.coef_max)

    def state_dict(self) -> dict:
        return {"level": self.level, "active": self.active}

    def load_state_dict(self, state: dict) -> None:
        self.level, self.active = float(state["level"]), bool(state["active"])

