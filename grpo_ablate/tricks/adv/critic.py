"""Family `adv`, PPO with a critic (`gae`): a value head's per-token values, GAE over the token rewards,
per-token advantages; the critic's own loss is the family `value_clip` (tricks/value_clip.py).

Flexible lambda (AReaL 74c633476, #1600: areal/trainer/ppo/gae.py, lambda_fn.py): a per-sample lambda
from the row's length (`lam_fn`: VAPO's length-adaptive 1 - 1/(alpha L), or relative-position q^(1/(L-1))),
and GAE over turns instead of tokens (`timestep=turn`: here every row is one turn). Its knobs are hashed
only away from the plain GAE they reduce to (their `neutral`), so every adv=gae run recorded before them
hashes, and resumes, as it did.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import FLAG, FRACTION, POSITIVE, Allowed, ReadWhen, Trick, choice, register

LAM_FNS = ("constant", "vapo", "relative_position")
TIMESTEPS = ("token", "turn")
RETENTION = Allowed(low=0, low_open=True, high=1)   # relative_position's q: 0 < q <= 1


def token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """An outcome reward placed on the last trained token of each completion."""
    out = torch.zeros_like(mask, dtype=rewards.dtype)
    last = (mask.sum(dim=1).long() - 1).clamp(min=0)
    out[torch.arange(mask.shape[0]), last] = rewards * (mask.sum(dim=1) > 0).to(rewards.dtype)
    return out


def gae(token_reward: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0):
    """Generalized advantage estimation over completion tokens: (advantages, returns) [N, L].

    delta_t = r_t + gamma V_{t+1} - V_t (V after the last token is 0); A_t = sum_k (gamma lam)^k
    delta_{t+k}; returns = A + V. Reference: verl core_algos `compute_gae_advantage_return`.
    """
    values = values * mask
    advantages = torch.zeros_like(values)
    running = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    for t in reversed(range(values.shape[1])):
        next_value = values[:, t + 1] if t + 1 < values.shape[1] else torch.zeros_like(running)
        delta = token_reward[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def timestep_lengths(mask: torch.Tensor, timestep: str = "token") -> torch.Tensor:
    """L per row [N]: its trained tokens (EOS included) for token-level GAE, its non-empty turns for
    turn-level (AReaL `_build_gae_lambda_context`'s timestep_lengths). A row here is one turn: 1, or 0 when
    none of its tokens is trained."""
    tokens = mask.sum(dim=1)
    return tokens if timestep == "token" else (tokens > 0).to(mask.dtype)


def sample_lambda(mask: torch.Tensor, *, lam_fn: str = "constant", lam: float = 1.0, alpha: float = 0.05,
                  q: float = 0.5, timestep: str = "token"):
    """lambda per row [N] from its length L (timestep_lengths), or the float `lam` for `constant`.

    vapo:              max(0, 1 - 1/(alpha L)) for L > 0, 0 for L = 0 (VAPO, arXiv 2504.05118, eq. 8;
                       AReaL lambda_fn.vapo_length_adaptive_gae);
    relative_position: q^(1/(L-1)) for L >= 2, 1 for L = 1, 0 for L = 0: with gamma = 1 a terminal reward
                       keeps the fraction q at the first step whatever the length (AReaL
                       lambda_fn.relative_position_gae_lambda). Computed in the mask's dtype (AReaL: float32).
    """
    if lam_fn == "constant":
        return lam
    length = timestep_lengths(mask, timestep)
    zero = torch.zeros_like(length)
    if lam_fn == "vapo":
        adaptive = (1.0 - 1.0 / (alpha * length.clamp(min=1.0))).clamp(min=0.0)
        return torch.where(length > 0, adaptive, zero)
    if lam_fn == "relative_position":
        per_step = torch.exp(torch.log(torch.tensor(q, dtype=length.dtype, device=length.device))
                             / (length - 1).clamp(min=1.0))
        return torch.where(length > 1, per_step, torch.where(length == 1, torch.ones_like(length), zero))
    raise ValueError(f"lam_fn={lam_fn!r}; allowed: {', '.join(LAM_FNS)}")


def turn_gae(token_reward: torch.Tensor, values: torch.Tensor, mask: torch.Tensor):
    """GAE with each row's one turn as its one timestep (AReaL `_compute_turn_level_gae` with every
    trained token in turn 0): r = the turn's summed token rewards, V = the value at its first trained
    token, delta = r + gamma * 0 - V (the turn ends the episode), A = delta; A and the critic target
    A + V = r are broadcast to the turn's tokens. gamma and lambda act between turns: with one turn,
    neither changes anything."""
    turn_reward = (token_reward * mask).sum(dim=1)
    first = (mask > 0).to(torch.int64).argmax(dim=1)
    turn_value = values.gather(1, first[:, None])[:, 0] * (mask.sum(dim=1) > 0).to(values.dtype)
    advantage = turn_reward - turn_value
    return advantage[:, None] * mask, (advantage + turn_value)[:, None] * mask


def flexible_gae(token_reward: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float = 1.0,
                 lam: float = 1.0, lam_fn: str = "constant", alpha: float = 0.05, q: float = 0.5,
                 timestep: str = "token"):
    """(advantages, returns) [N, L]: `gae` with a per-sample lambda (`sample_lambda`), or `turn_gae`."""
    if timestep == "turn":
        return turn_gae(token_reward, values, mask)
    return gae(token_reward, values, mask, gamma,
               sample_lambda(mask, lam_fn=lam_fn, lam=lam, alpha=alpha, q=q, timestep=timestep))


def critic_returns(rewards: torch.Tensor, mask: torch.Tensor, old_values: torch.Tensor, **knobs) -> torch.Tensor:
    """The critic's targets under V_old for the option's knobs (those that are not GAE's are ignored):
    the same lambda (per sample too) and timestep as its advantages, as in AReaL, where one lambda
    serves both (VAPO's Decoupled-GAE gives the critic lambda = 1; not followed, see the docs)."""
    keep = {k: v for k, v in knobs.items() if k in ("gamma", "lam", "lam_fn", "alpha", "q", "timestep")}
    return flexible_gae(token_rewards(rewards, mask), old_values, mask, **keep)[1]


def _turn_keeps_kl_out(cfg):
    """AReaL keeps KL out of the turn recurrence and adds each token's own KL_t to its advantage; here
    kl=in_reward charges one sum per completion, which that cannot split back into tokens."""
    if cfg.adv.get("timestep", "token") != "turn" or cfg.kl.name != "in_reward" or not cfg.kl.beta > 0:
        return None
    return ("adv.timestep=turn keeps the KL out of the turn recurrence (AReaL adds each token's KL_t to its "
            "advantage), but kl=in_reward charges one sum per completion; use kl=fixed (the KL in the loss)")


def _lambda_needs_token_steps(cfg):
    """A per-sample lambda weighs the steps between timesteps; a row here is one turn, so with
    timestep=turn there is none (AReaL's turn_counts would be 1 for every row)."""
    lam_fn = cfg.adv.get("lam_fn", "constant")
    if cfg.adv.get("timestep", "token") != "turn" or lam_fn == "constant":
        return None
    return (f"adv.lam_fn={lam_fn} does nothing with adv.timestep=turn: every completion here is one turn, so "
            "there is no step between turns for lambda to weigh; use adv.timestep=token")


VAPO_GAE = Trick(
    "vapo_gae", what="VAPO's length-adaptive GAE lambda: each completion's lambda = 1 - 1/(0.05 L), L its trained "
                     "tokens (0 below 20 tokens), for its advantages and its critic targets",
    source="AReaL 74c633476 (#1600) actor.gae_lambda=areal.trainer.ppo.lambda_fn.vapo_length_adaptive_gae; "
           "VAPO (arXiv 2504.05118) alpha 0.05",
    verdict="not_in_review", cost="a value head and its loss; pi_old forward each step for V_old",
    settings={"lam_fn": "vapo", "alpha": 0.05})


@register("adv", "gae",
          what="PPO with a critic: a value head on the policy, GAE over token rewards, whitened",
          uses_group_statistic=False, uses_values=True,
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
                        cost="a value head and its loss; pi_old forward each step for V_old"), VAPO_GAE))
def gae_advantage(rewards, group_index, mask, values, components, *, gamma: float = 1.0, lam: float = 1.0,
                  whiten: bool = True, lam_fn: str = "constant", alpha: float = 0.05, q: float = 0.5,
                  timestep: str = "token"):
    """PPO with a critic: GAE over token rewards (the outcome reward on the last token), then
    whitened over the batch's completion tokens as verl does (`whiten: true`). gamma = lam = 1
    by default, so A_t = R - V_t.

    Unlisted knobs (AReaL 74c633476): `lam_fn` vapo | relative_position replaces `lam` by a lambda per
    completion (`sample_lambda`; alpha for vapo, q for relative_position); `timestep=turn` runs GAE over
    turns (`turn_gae`: a row is one turn, so A = R - V at its first token)."""
    advantages, _ = flexible_gae(token_rewards(rewards, mask), values, mask, gamma=gamma, lam=lam, lam_fn=lam_fn,
                                 alpha=alpha, q=q, timestep=timestep)
    if not whiten:
        return advantages
    n = mask.sum().clamp(min=1)
    mean = (advantages * mask).sum() / n
    var = (((advantages - mean) * mask) ** 2).sum() / n
    return (advantages - mean) * torch.rsqrt(var + 1e-8) * mask
