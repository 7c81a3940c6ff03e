"""Family `adv`, PPO with a critic (`gae`): a value head's per-token values, GAE over the token rewards,
per-token advantages; the critic's own loss is the family `value_clip` (tricks/value_clip.py).

The recursion runs over the trained tokens only: on a multi-turn task the environment's replies inside a
trajectory (mask 0 under env_mask=masked) take no step (verl `compute_gae_advantage_return`, #2337; AReaL's
token-level GAE). Flexible lambda (AReaL 74c633476, #1600: areal/trainer/ppo/gae.py, lambda_fn.py): a
per-sample lambda from the row's length (`lam_fn`: VAPO's length-adaptive 1 - 1/(alpha L), or
relative-position q^(1/(L-1))), and GAE over turns instead of tokens (`timestep=turn`: each policy turn one
step, read from the rollout's `turn_index`, which the trainer supplies; a single-turn task's row is one
turn). Its knobs are hashed only away from the plain GAE they reduce to (their `neutral`), so every adv=gae
run recorded before them hashes, and resumes, as it did.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import single_turn
from grpo_ablate.tricks.registry import FLAG, FRACTION, POSITIVE, Allowed, ReadWhen, Trick, choice, register

LAM_FNS = ("constant", "vapo", "relative_position")
TIMESTEPS = ("token", "turn")
RETENTION = Allowed(low=0, low_open=True, high=1)   # relative_position's q: 0 < q <= 1


def token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """An outcome reward placed on the last trained token of each completion (on a multi-turn task the
    policy's last token: an episode that ends on a tool's reply still ends its trained tokens before it)."""
    out = torch.zeros_like(mask, dtype=rewards.dtype)
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(mask > 0, positions, torch.zeros_like(positions)).amax(dim=1)
    out[torch.arange(mask.shape[0]), last] = rewards * (mask.sum(dim=1) > 0).to(rewards.dtype)
    return out


def gae(token_reward: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0):
    """Generalized advantage estimation over the trained tokens: (advantages, returns) [N, L].

    delta_t = r_t + gamma V_next - V_t, A_t = delta_t + gamma lam A_next, returns = A + V, where `next` is
    the next trained token (after the last one V = 0, A = 0). A token with mask 0 inside a trajectory (a
    tool's reply on a multi-turn task) takes no step: the next value and the running advantage are carried
    across it, so gamma and lambda decay once per trained token (verl volcengine/verl b178a3cd
    core_algos `compute_gae_advantage_return`, "skip values and TD-error on observation tokens", #2337;
    AReaL 74c633476 `_compute_token_level_gae`). On a completion whose trained tokens are one run from its
    first token (every single-turn task) that is the plain recurrence over consecutive tokens.
    """
    values = values * mask
    advantages = backward_recursion(token_reward, values, mask > 0, gamma, lam) * mask
    return advantages, (advantages + values) * mask


def backward_recursion(reward: torch.Tensor, value: torch.Tensor, present: torch.Tensor, gamma: float, lam):
    """GAE's recursion over the steps of each row [N, S], last to first: delta_s = r_s + gamma V_next - V_s,
    A_s = delta_s + gamma lam A_next, `next` the next step that is `present` (after the last: V = A = 0); a
    step not present takes no step, the running A and V carried across it (and returned there)."""
    out = torch.zeros_like(value)
    running = torch.zeros(value.shape[0], dtype=value.dtype, device=value.device)
    next_value = torch.zeros_like(running)
    for s in reversed(range(value.shape[1])):
        delta = reward[:, s] + gamma * next_value - value[:, s]
        step = delta + gamma * lam * running
        running = torch.where(present[:, s], step, running)
        next_value = torch.where(present[:, s], value[:, s], next_value)
        out[:, s] = running
    return out


def turn_members(mask: torch.Tensor, turn_index: torch.Tensor | None) -> torch.Tensor:
    """[N, U, L] bool: token t is a trained token of turn u (U: the highest turn with a trained token, + 1).
    Without a turn index (a single-turn task) every trained token is in turn 0. A tool's reply belongs to
    the turn it answers (sampling/multi_turn.py): trained (env_mask=unmasked), it is one of that turn's tokens."""
    trained = mask > 0
    if turn_index is None:
        return trained[:, None, :]
    turn_index = turn_index.to(mask.device)
    turns = int(torch.where(trained, turn_index, torch.zeros_like(turn_index)).max().item()) + 1 if mask.numel() else 1
    return trained[:, None, :] & (turn_index[:, None, :] == torch.arange(turns, device=mask.device)[None, :, None])


def timestep_lengths(mask: torch.Tensor, timestep: str = "token",
                     turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """L per row [N]: its trained tokens (EOS included) for token-level GAE, its turns with a trained token
    for turn-level (AReaL `_build_gae_lambda_context`'s timestep_lengths: turn_counts). A row of a
    single-turn task is one turn: 1, or 0 when none of its tokens is trained."""
    tokens = mask.sum(dim=1)
    if timestep == "token":
        return tokens
    if turn_index is None:
        return (tokens > 0).to(mask.dtype)
    return turn_members(mask, turn_index).any(dim=2).sum(dim=1).to(mask.dtype)


def sample_lambda(mask: torch.Tensor, *, lam_fn: str = "constant", lam: float = 1.0, alpha: float = 0.05,
                  q: float = 0.5, timestep: str = "token", turn_index: torch.Tensor | None = None):
    """lambda per row [N] from its length L (timestep_lengths), or the float `lam` for `constant`.

    vapo:              max(0, 1 - 1/(alpha L)) for L > 0, 0 for L = 0 (VAPO, arXiv 2504.05118, eq. 8;
                       AReaL lambda_fn.vapo_length_adaptive_gae);
    relative_position: q^(1/(L-1)) for L >= 2, 1 for L = 1, 0 for L = 0: with gamma = 1 a terminal reward
                       keeps the fraction q at the first step whatever the length (AReaL
                       lambda_fn.relative_position_gae_lambda). Computed in the mask's dtype (AReaL: float32).
    """
    if lam_fn == "constant":
        return lam
    length = timestep_lengths(mask, timestep, turn_index)
    zero = torch.zeros_like(length)
    if lam_fn == "vapo":
        adaptive = (1.0 - 1.0 / (alpha * length.clamp(min=1.0))).clamp(min=0.0)
        return torch.where(length > 0, adaptive, zero)
    if lam_fn == "relative_position":
        per_step = torch.exp(torch.log(torch.tensor(q, dtype=length.dtype, device=length.device))
                             / (length - 1).clamp(min=1.0))
        return torch.where(length > 1, per_step, torch.where(length == 1, torch.ones_like(length), zero))
    raise ValueError(f"lam_fn={lam_fn!r}; allowed: {', '.join(LAM_FNS)}")


def turn_gae(token_reward: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
             turn_index: torch.Tensor | None = None, gamma: float = 1.0, lam=1.0):
    """GAE with each policy turn as one timestep (AReaL 74c633476 `_compute_turn_level_gae`,
    actor.gae_timestep_unit=turn): (advantages, returns) [N, L].

    For turn u of a row: r_u its trained tokens' rewards summed (the outcome reward sits on the last
    trained token, so in the last turn), V_u the value at its first trained token,
        delta_u = r_u + gamma V_{u+1} - V_u,    A_u = delta_u + gamma lam A_{u+1}
    (after the last turn V = 0, A = 0; a turn without a trained token takes no step: the next value and
    advantage are carried across it); A_u and the critic's target A_u + V_u are given to every trained
    token of turn u. The environment's tokens (mask 0) take no step and get 0. `lam`: a float or one per
    row [N] (sample_lambda). Without `turn_index` (a single-turn task) a row is one turn: A = R - V at its
    first trained token, the target R, and gamma and lambda change nothing."""
    members = turn_members(mask, turn_index)                            # [N, U, L]
    has_turn = members.any(dim=2)                                       # [N, U]
    turn_reward = (token_reward[:, None, :] * mask[:, None, :] * members).sum(dim=2)
    first = members.to(torch.int64).argmax(dim=2)                       # the turn's first trained token
    turn_value = values.gather(1, first) * has_turn.to(values.dtype)
    turn_adv = backward_recursion(turn_reward, turn_value, has_turn, gamma, lam)   # read at turns present only
    token_turn = members.to(torch.int64).argmax(dim=1)                  # each trained token's turn (0 elsewhere)
    advantages = turn_adv.gather(1, token_turn) * mask
    return advantages, (turn_adv + turn_value).gather(1, token_turn) * mask


def flexible_gae(token_reward: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float = 1.0,
                 lam: float = 1.0, lam_fn: str = "constant", alpha: float = 0.05, q: float = 0.5,
                 timestep: str = "token", turn_index: torch.Tensor | None = None):
    """(advantages, returns) [N, L]: `gae` or `turn_gae` (timestep), with a lambda per sample
    (`sample_lambda`) or the float `lam`."""
    lam = sample_lambda(mask, lam_fn=lam_fn, lam=lam, alpha=alpha, q=q, timestep=timestep, turn_index=turn_index)
    if timestep == "turn":
        return turn_gae(token_reward, values, mask, turn_index, gamma, lam)
    return gae(token_reward, values, mask, gamma, lam)


def critic_returns(rewards: torch.Tensor, mask: torch.Tensor, old_values: torch.Tensor,
                   turn_index: torch.Tensor | None = None, **knobs) -> torch.Tensor:
    """The critic's targets under V_old for the option's knobs (those that are not GAE's are ignored):
    the same lambda (per sample too) and timestep as its advantages, as in AReaL, where one lambda
    serves both (VAPO's Decoupled-GAE gives the critic lambda = 1; not followed, see the docs)."""
    keep = {k: v for k, v in knobs.items() if k in ("gamma", "lam", "lam_fn", "alpha", "q", "timestep")}
    return flexible_gae(token_rewards(rewards, mask), old_values, mask, turn_index=turn_index, **keep)[1]


def _turn_keeps_kl_out(cfg):
    """AReaL keeps KL out of the turn recurrence and adds each token's own KL_t to its advantage; here
    kl=in_reward charges one sum per completion, which that cannot split back into tokens."""
    if cfg.adv.get("timestep", "token") != "turn" or cfg.kl.name != "in_reward" or not cfg.kl.beta > 0:
        return None
    return ("adv.timestep=turn keeps the KL out of the turn recurrence (AReaL adds each token's KL_t to its "
            "advantage), but kl=in_reward charges one sum per completion; use kl=fixed (the KL in the loss)")


def _lambda_needs_token_steps(cfg):
    """A per-sample lambda weighs the steps between timesteps; on a single-turn task a completion is one
    turn, so with timestep=turn there is none (AReaL's turn_counts would be 1 for every row). On a
    multi-turn task the turns are counted from the rollout's turn index."""
    lam_fn = cfg.adv.get("lam_fn", "constant")
    if cfg.adv.get("timestep", "token") != "turn" or lam_fn == "constant" or not single_turn(cfg):
        return None
    return (f"adv.lam_fn={lam_fn} does nothing with adv.timestep=turn on a single-turn task: every completion is "
            "one turn, so there is no step between turns for lambda to weigh; use adv.timestep=token, or a "
            "multi-turn task (task=calculator)")


VAPO_GAE = Trick(
    "vapo_gae", what="VAPO's length-adaptive GAE lambda: each completion's lambda = 1 - 1/(0.05 L), L its trained "
                     "tokens (0 below 20 tokens), for its advantages and its critic targets",
    source="AReaL 74c633476 (#1600) actor.gae_lambda=areal.trainer.ppo.lambda_fn.vapo_length_adaptive_gae; "
           "VAPO (arXiv 2504.05118) alpha 0.05",
    verdict="not_in_review", cost="a value head and its loss; pi_old forward each step for V_old",
    settings={"lam_fn": "vapo", "alpha": 0.05})

# No claim: AReaL's docs and PR state what the recurrence does, not an effect on training. What shows its
# steps in a run is `turns/mean` (a multi-turn task logs it every step): the turns of an episode are the
# recurrence's timesteps. Not inert on a single-turn task, only degenerate: one step, A = R - V at the first
# token for every token, where token-level GAE gives A_t = R - V_t (gamma = lam = 1).
TURN_GAE = Trick(
    "turn_gae", what="GAE over the policy's turns: each turn of a multi-turn episode one timestep (its rewards "
                     "summed, V read at its first policy token), its advantage and critic target given to each of "
                     "its tokens; the tool's reply takes no step (on a single-turn task: one step, A = R - V_first)",
    source="AReaL 74c633476 (#1600) actor.gae_timestep_unit=turn (areal/trainer/ppo/gae.py "
           "_compute_turn_level_gae)",
    verdict="not_in_review", cost="a value head and its loss; pi_old forward each step for V_old",
    settings={"timestep": "turn"})


@register("adv", "gae",
          what="PPO with a critic: a value head on the policy, GAE over token rewards, whitened",
          uses_group_statistic=False, uses_values=True,
          reads_turn_index=True,   # timestep=turn's turns, lam_fn's turn counts: the trainer supplies turn_index
          # the λ schedule's knobs came after runs existed: hashed only away from the plain GAE they reduce
          # to (lam_fn=constant, timestep=token), alpha and q only where the lam_fn that reads them is chosen
          knobs={"gamma": FRACTION, "lam": FRACTION.but(read_when=ReadWhen("lam_fn", ("constant",))), "whiten": FLAG,
                 "lam_fn": choice(*LAM_FNS).but(neutral="constant"),
                 "alpha": POSITIVE.but(neutral=ReadWhen("lam_fn", ("vapo",))),
                 "q": RETENTION.but(neutral=ReadWhen("lam_fn", ("relative_position",))),
                 "timestep": choice(*TIMESTEPS).but(neutral="token")},
          notes={"value_coef": "weight of the value loss in the total loss"},
          checks=(_turn_keeps_kl_out, _lambda_needs_token_steps),
          writes=("adv/std", "value/explained_variance"),
          tricks=(Trick("critic_gae",
                        what="PPO with a critic: value head, GAE advantages per token",
                        source="verl adv_estimator=gae",
                        verdict="not_applicable",
                        cost="a value head and its loss; pi_old forward each step for V_old"), VAPO_GAE, TURN_GAE))
def gae_advantage(rewards, group_index, mask, values, components, *, gamma: float = 1.0, lam: float = 1.0,
                  whiten: bool = True, lam_fn: str = "constant", alpha: float = 0.05, q: float = 0.5,
                  timestep: str = "token", turn_index=None):
    """PPO with a critic: GAE over token rewards (the outcome reward on the last trained token), then
    whitened over the batch's trained tokens as verl does (`whiten: true`). gamma = lam = 1
    by default, so A_t = R - V_t.

    Knobs of AReaL 74c633476: `lam_fn` vapo | relative_position replaces `lam` by a lambda per
    completion (`sample_lambda`; alpha for vapo, q for relative_position); `timestep=turn` runs GAE over
    the policy's turns (`turn_gae`), read from `turn_index` [N, T] (the rollout's, supplied by the trainer;
    None on a single-turn task, where a row is one turn: A = R - V at its first token)."""
    advantages, _ = flexible_gae(token_rewards(rewards, mask), values, mask, gamma=gamma, lam=lam, lam_fn=lam_fn,
                                 alpha=alpha, q=q, timestep=timestep, turn_index=turn_index)
    if not whiten:
        return advantages
    n = mask.sum().clamp(min=1)
    mean = (advantages * mask).sum() / n
    var = (((advantages - mean) * mask) ** 2).sum() / n
    return (advantages - mean) * torch.rsqrt(var + 1e-8) * mask
