"""Family `clip`: the policy loss, per token, one module per kind of loss:

- `ratio`: the importance ratio clipped, gated or masked per token (PPO clip, clip-higher, SAPO, DPPO),
  and what the other kinds share (the clamped ratio, the clip indicators, the knob ranges);
- `sequence`: one importance ratio per sequence (GSPO, GMPO, LUSPO);
- `covariance`: the tokens of high advantage/log-prob covariance masked or penalised (Clip-Cov, KL-Cov);
- `reinforce`: -w A log pi, with a weight that carries no gradient or a penalty instead of a clip
  (CISPO and its sampler-anchored form, GPG, VESPO, TOPR, Kimi k1.5, clamped REINFORCE, DRO, rollout IS);
- `local`: no ratio: the sampled logit, centred on pi_old's top-K, regressed onto eta A (LOCAL).

Every option takes (logp, old_logp, advantages, mask) -- [N, T] log-probs of the current and the
rollout-time policy, [N, 1] or [N, T] advantages, the [N, T] float mask of trained tokens -- and
returns (loss [N, T], stats), stats a dict metric name -> per-token float tensor [N, T] that the
trainer token-averages over the mask. The loss is aggregated afterwards by `loss_agg` (sum_t w_t l_t);
a sequence-level loss returns a per-token tensor whose aggregation under the mode its reference uses
reproduces the reference (named in each docstring).

Notation: rho_t = exp(logp_t - old_logp_t), Delta_t = logp_t - old_logp_t, sg = stop-gradient.

Flags: `off_policy_only` -- the option's gradient equals plain PPO-clip's when rho == 1, so
it can act only with several optimizer steps per rollout or a sampler-trainer mismatch.
`per_sequence_loss` -- one loss value per sequence (gmpo): token-level importance weights of
rollout_correction enter per sequence (setting clip.is_weights, see gmpo_loss).
`sequence_ratio` -- one importance ratio per sequence, whose reference objective counts each
sequence once (gspo, gmpo, luspo: under seq_mean_token_mean); a loss_agg that `weights_by_length`
changes that objective (grpo_ablate/config/pair_rules.py warns).
`ratio_on_sampler` -- the loss's ratio is against the sampler's log-probs mu, not pi_old (cispo_rollout,
SkyRL cispo_anchor=rollout): the trainer hands mu's as `old_logp` to this loss only (train/losses.py).
`centres_on_old_topk` -- the loss regresses centred log-probs psi = log pi(a) - sum_{b in T} pbar(b) log pi(b),
T pi_old's top-`topk` (local): the trainer hands psi_theta and psi_old as `logp` and `old_logp` to this
loss only (train/forward.py computes them; every other term keeps the log-probs).
"""
from grpo_ablate.tricks.registry import POSITIVE_INT, choice, declare_family

declare_family("clip", "the policy loss: PPO ratio clip ε_low/ε_high (`higher` is DAPO clip-higher), or a "
               "variant (sequence ratio, clipped IS weight, soft gate, geometric mean, covariance masks, plain "
               "REINFORCE, a logit regression); all but `clip_cov`, `luspo` and `local` act only with several "
               "optimizer steps per rollout",
               stage="loss", default="symmetric",
               metric="clip/high_frac",
               supplied={"dual_clip_c": "dual_clip.c", "generator": "the trainer (seeded, checkpointed)"},
               # a per-sequence loss (gmpo): token-level rollout IS weights as their per-sequence
               # geometric mean (verl) or each token's own (token); read by the trainer (train/losses.py)
               settings={"is_weights": (choice("geometric", "token"), "per_sequence_loss"),
                         # the size K of pi_old's top-K support that a centring loss (local) reads: the trainer's
                         # forwards gather it (train/forward.py), so a setting of the family, not a knob of the loss
                         "topk": (POSITIVE_INT, "centres_on_old_topk")},
               defaults={"is_weights": "geometric"})

# after the declaration: registering an option reads the family's supplied knobs (dual_clip_c, generator);
# the order of the kinds is the order of the options in docs/config.md
from grpo_ablate.tricks.clip import ratio, sequence, covariance, reinforce, local  # noqa: E402

__all__ = ["covariance", "local", "ratio", "reinforce", "sequence"]
