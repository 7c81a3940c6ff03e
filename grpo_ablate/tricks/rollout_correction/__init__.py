"""Family `rollout_correction`: the sampler-trainer mismatch, corrected on the policy loss, one module
per kind:

- `weights`: importance weights π_old / μ per token or sequence, truncated or masked (TRL's modes, verl's
  rollout_is), AReaL's decoupled PPO and the m2po mask; the family's conventions (the data arguments,
  the log-ratio clamp, verl's mismatch metrics) and its inert rule;
- `rejection`: the rejection masks of AReaL, verl, SkyRL, ROLL and OpenRLHF on a divergence of π_old
  from μ (`rejection`);
- `tv_filter`: open-instruct's TV-divergence filter, the one option that reads the advantages (the
  trainer supplies them and computes its weights after the advantage chain);
- `combined`: the gates of asynchronous GRPO without pi_old (TRL AsyncGRPO), on the combined ratio
  π_θ / μ: computed in the loss, per forward (`reads_current_policy`), the policy loss's ratio taken
  against μ (`ratio_on_sampler`).
"""
from grpo_ablate.tricks.registry import declare_family

declare_family("rollout_correction", "importance weights π_old / π_sampler on the policy loss, with verl's mismatch "
               "metrics `rollout_corr/*`; AReaL's `decoupled` PPO and `m2po` mask; open-instruct's `tv_filter` (reads "
               "the advantages); TRL AsyncGRPO's `combined_*` gates on π_θ / μ (no π_old); acts "
               "with stale rollouts (`staleness`), `rollout.dtype=bfloat16` or vLLM",
               stage="loss", metric="rollout_corr/is_mean",
               supplied={"advantages": "the trainer, after the advantage chain (an option with the "
                                       "`reads_advantages` flag)"})

# after the declaration: registering an option reads its family's declaration; the order of the kinds
# is the order of the options in docs/config.md
from grpo_ablate.tricks.rollout_correction import weights, rejection, tv_filter, combined  # noqa: E402

__all__ = ["combined", "rejection", "tv_filter", "weights"]
