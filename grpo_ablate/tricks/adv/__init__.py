"""Family `adv`: advantage estimators, r (one scalar per completion) -> A, one module per kind:

- `group`: from the group's own rewards (GRPO and its normalizations, RLOO, OPO, pass@k, GPG, MaxRL, GDPO,
  hierarchical GRPO);
- `critic`: PPO with a value head and GAE (`gae`);
- `optimal`: the baselines of least gradient variance, weighted per token (OTB) or per trajectory (OPOB);
- `reinforce`: a baseline from outside the group: a greedy completion's reward (ReMax), an EMA (RAE).

Groups are given as `group_index` (completion j belongs to prompt group_index[j]), which also
covers ragged groups. Every estimator takes (rewards [N], group_index [N], mask [N, T], values
[N, T] or None, components: dict name -> [N], the reward's parts (task, format, length,
overlong, kl), each already weighted, summing to rewards; read only by gdpo) and returns A: [N]
per completion, which the trainer broadcasts over the completion's tokens, or [N, T] per token.
Flags:
  uses_group_statistic  needs G >= 2 completions per prompt to mean anything
  uses_values           needs a critic: per-token values in, per-token advantages out
  reads_turn_index      takes the keyword `turn_index` [N, T] (the turn of each completion token on a multi-turn
                        task, None on a single-turn one), supplied by the trainer (train/rewards.py AdvantageChain)
  undoes_affine_maps    A of a*r + b (a > 0) is A of r, up to eps: a reward normalization before it changes nothing
  scores_within_episodes  baselines over episodes of a group (train/state/adv.py reports adv/episode_gap)
"""
from grpo_ablate.tricks.registry import NON_NEGATIVE, declare_family

declare_family("adv", "advantage estimator; `gae` adds a critic (value head) and per-token advantages; `gdpo` "
               "normalizes each reward part (task, format, length, overlong, KL) in its group",
               stage="advantage", default="grpo", metric="adv/std",
               settings={"value_coef": (NON_NEGATIVE, "uses_values")},   # the critic's loss weight (adv=gae)
               defaults={"value_coef": 0.5},
               supplied={"turn_index": "the trainer: the rollout's turn of each token (an option with the "
                                       "`reads_turn_index` flag)"})

# after the declaration: registering an option reads its family's declaration; the order of the kinds
# is the order of the options in docs/config.md
from grpo_ablate.tricks.adv import group, critic, optimal, reinforce  # noqa: E402

__all__ = ["critic", "group", "optimal", "reinforce"]
