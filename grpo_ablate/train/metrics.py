"""A GRPO step's metrics, from plain tensors: one flat dict, a row of metrics.jsonl.

Token statistics are means over the trained tokens (`mask`) unless the name says otherwise.
Each family's own activity metric is here, so the report can tell a trick that acted from
one that had nothing to act on: sampling/*, overlong/*, length/reward_mean,
adv/clipped_frac, clip/*_frac, ppo/* (how far off-policy the optimizer steps were), kl/*,
entropy/coef, temperature/value, value/*.
"""
from __future__ import annotations

import torch

from grpo_ablate.tricks.adv.group import group_mean_std
from grpo_ablate.tricks.kl import k1, k3
from grpo_ablate.tricks.behaviour import log_ratio as behaviour_log_ratio
from grpo_ablate.tricks.loss_agg import masked_mean
from grpo_ablate.tricks.value_clip import explained_variance


def sampling_metrics(rounds: int, groups: int, rows: int, prompts_per_step: int, group_size: int,
                     drawn: int = 0) -> dict:
    """What the `sampling` family did: rounds of fresh prompts, groups kept, completions added.
    `drawn`: the prompts the rounds drew (a refill policy or over-sampling makes rounds of other
    sizes than B); 0 when every round drew B."""
    drawn = drawn or rounds * prompts_per_step
    return {"sampling/rounds": rounds,
            "sampling/kept_group_frac": groups / drawn,
            "sampling/extra_generations": (drawn - prompts_per_step) * group_size + rows - groups * group_size,
            "sampling/mean_group_size": rows / groups}


def masked_group_metrics(trained, scores, group_index) -> dict:
    """What a sampling option that masks groups out of the loss did (variance_mass): the share of the
    batch's groups masked, and the share of the batch's reward variance (each group's, ddof 1, of the
    verifier's scores) that the trained groups hold (1 when the batch has none to lose)."""
    groups = int(group_index.max()) + 1
    scores, trained = scores.detach().double().cpu(), trained.cpu()
    index = group_index.cpu()
    sizes = torch.bincount(index, minlength=groups).double()
    mean = torch.zeros(groups, dtype=torch.float64).index_add_(0, index, scores) / sizes
    squares = torch.zeros(groups, dtype=torch.float64).index_add_(0, index, (scores - mean[index]) ** 2)
    high = torch.full((groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, index, scores, "amax")
    low = torch.full((groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, index, scores, "amin")
    variance = torch.where(high > low, squares / (sizes - 1).clamp(min=1), 0.0)
    kept = torch.zeros(groups, dtype=torch.bool).index_fill_(0, index[trained], True)
    total = float(variance.sum())
    return {"sampling/masked_group_frac": float((~kept).double().mean()),
            "sampling/kept_variance_frac": float(variance[kept].sum()) / total if total > 0 else 1.0}


def reward_metrics(scores, rewards, group_index, overlong_penalty, keep, length_reward) -> dict:
    """`scores` the verifier's 0/1 (unshaped), `rewards` what the advantage estimator saw."""
    groups = int(group_index.max()) + 1
    _, group_std = group_mean_std(rewards, group_index)
    zero_std = torch.zeros(groups, device=rewards.device).index_fill_(0, group_index[group_std == 0], 1.0)
    return {"reward/mean": rewards.mean().item(),
            "reward/std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "train/accuracy": scores.mean().item(),
            "overlong/penalty_mean": overlong_penalty.mean().item(),
            "overlong/masked_frac": (~keep).float().mean().item(),
            "length/reward_mean": length_reward.mean().item(),
            "adv/zero_std_group_frac": zero_std.mean().item()}


def completion_metrics(lengths, truncated) -> dict:
    return {"length/mean": lengths.mean().item(), "length/max": lengths.max().item(),
            "length/truncated_frac": truncated.float().mean().item()}


def turn_metrics(roll, mask) -> dict:
    """A multi-turn batch's episodes (sampling/multi_turn.py): policy turns per episode, the share of
    turns without a usable reply (a call that did not parse, a tool that raised, a turn cut by its
    budget), the policy's tokens per turn, the environment's tokens per episode, and the share of the
    trained tokens `mask` that the environment wrote (env_mask: 0 when they are masked)."""
    sampled = roll.sampled.to(mask.device) * roll.completion_mask.to(mask.device)
    env = roll.completion_mask.to(mask.device) - sampled
    turns = roll.turns.float()
    return {"turns/mean": turns.mean().item(),
            "turns/failed_frac": (roll.failed_turns.float().sum() / turns.sum().clamp(min=1)).item(),
            "turns/tokens_per_turn": (sampled.sum() / turns.sum().clamp(min=1)).item(),
            "turns/env_tokens_mean": env.sum(dim=1).mean().item(),
            "turns/turn_reward": roll.turn_reward.float().mean().item(),
            "env_mask/env_token_frac": ((mask * env).sum() / mask.sum().clamp(min=1)).item()}


def advantage_metrics(advantages, mask, clipped_frac, outcome=None) -> dict:
    """Over completions, or over trained tokens for a per-token estimator (gae). `outcome`: the outcome
    reward's advantages before turn_credit (a multi-turn batch): turn_credit/shift, the mean |A_t - A^O_t|
    over trained tokens, is what the turn rewards moved."""
    values = advantages[mask.bool()] if advantages.dim() == 2 else advantages
    out = {"adv/mean": values.mean().item(),
           "adv/std": values.std().item() if values.numel() > 1 else 0.0,
           "adv/min": values.min().item() if values.numel() else 0.0,
           "adv/max": values.max().item() if values.numel() else 0.0,
           "adv/clipped_frac": clipped_frac.item()}
    if outcome is not None:   # [N] or [N, T] each: as columns over the tokens
        rows = len(mask)
        shift = (advantages.reshape(rows, -1) - outcome.reshape(rows, -1)).abs().expand_as(mask)
        out["turn_credit/shift"] = masked_mean(shift, mask).item()
    return out


def token_means(token_stats: dict, mask) -> dict:
    """Per-token statistics of one optimizer step (clip fractions, the critic's loss) as means
    over its trained tokens."""
    return {name: masked_mean(value, mask).item() for name, value in token_stats.items()}


def ratio_metrics(logp, old_logp, mask) -> dict:
    """How far off-policy an optimizer step was: rho = pi_theta / pi_old over its trained tokens,
    and ppo_kl = mean(log pi_old - log pi_theta) (verl's actor/ppo_kl). pi_old None: the policy
    itself (one optimizer step per rollout), rho = 1."""
    log_ratio = torch.zeros_like(logp) if old_logp is None else (logp - old_logp).detach()
    ratio, kept = log_ratio.exp(), mask.bool()
    return {"ppo/ratio_mean": masked_mean(ratio, mask).item(),
            "ppo/ratio_min": ratio[kept].min().item() if kept.any() else 1.0,
            "ppo/ratio_max": ratio[kept].max().item() if kept.any() else 1.0,
            "ppo/kl": masked_mean(-log_ratio, mask).item()}


class StepMeans:
    """A rollout's optimizer steps, summarised: loss, grad norm and token statistics averaged
    over the steps (`*_min` / `*_max` statistics: the extreme over the steps)."""

    def __init__(self):
        self.losses, self.grad_norms, self.stats = [], [], {}

    def add(self, loss: float, grad_norm: float, stats: dict) -> None:
        self.losses.append(loss)
        self.grad_norms.append(grad_norm)
        for name, value in stats.items():
            self.stats.setdefault(name, []).append(value)

    @property
    def steps(self) -> int:
        return len(self.losses)

    def optimizer(self) -> tuple[float, float]:
        return sum(self.losses) / len(self.losses), sum(self.grad_norms) / len(self.grad_norms)

    def tokens(self) -> dict:
        pick = {"_min": min, "_max": max}
        return {name: pick.get(name[-4:], lambda v: sum(v) / len(v))(values) for name, values in self.stats.items()}


def kl_metrics(logp, ref_logp, prev_logp, mask) -> dict:
    """KL to the reference (k1 and k3, whatever estimator the loss uses) and to pi_prev."""
    out = {}
    if ref_logp is not None:
        out["kl/k1"] = masked_mean(k1(logp, ref_logp), mask).item()
        out["kl/k3"] = masked_mean(k3(logp, ref_logp), mask).item()
    if prev_logp is not None:
        out["kl/prev_k3"] = masked_mean(k3(logp, prev_logp), mask).item()
    return out


def critic_metrics(values, returns, mask) -> dict:
    return {"value/explained_variance": explained_variance(values, returns, mask).item()}


def sampler_gap_metrics(sampler_logp, logp, mask) -> dict:
    """How far the sampler's own log-probs (vLLM) are from the trainer's for the same tokens (an
    unknown sampler log-prob counts as no gap: tricks/behaviour.py)."""
    gap = behaviour_log_ratio(logp, sampler_logp).abs() * mask
    return {"rollout/logprob_gap_mean": (gap.sum() / mask.sum().clamp(min=1)).item(),
            "rollout/logprob_gap_max": gap.max().item()}


@torch.no_grad()
@torch.no_grad()
def kept_size_metrics(kept_ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """How many tokens a filtering sampler kept at each trained position (`rollout/kept_tokens_mean`), and
    the share of positions where it kept one alone (`rollout/one_token_frac`): at 1 the sampler is greedy,
    every completion of a group the same, and no advantage is nonzero."""
    sizes = (kept_ids >= 0).sum(dim=-1).to(mask.device, mask.dtype)   # NOT_KEPT pads a shorter set
    return {"rollout/kept_tokens_mean": masked_mean(sizes, mask).item(),
            "rollout/one_token_frac": masked_mean((sizes == 1).to(mask.dtype), mask).item()}


def kept_set_metrics(kept_log_mass, old_logp, sampler_logp, mask, replayed: bool) -> dict:
    """A filtering sampler's kept sets under pi_old: their mass (`rollout/kept_mass`), and the mean
    importance ratio pi_old / mu of the sampled tokens with pi_old scored over the kept set
    (`ratio_mean_kept`, what rollout.sampling_replay trains on) and over the whole vocabulary
    (`ratio_mean_full`). mu samples from the kept set renormalised, so E_mu[pi_full / mu] = pi(kept):
    without the replay the ratio's mean is the kept mass, not 1 (TRL #6789)."""
    full, kept = (old_logp + kept_log_mass, old_logp) if replayed else (old_logp, old_logp - kept_log_mass)
    out = {"rollout/kept_mass": masked_mean(kept_log_mass.exp(), mask).item()}
    if sampler_logp is not None:
        sampler_logp = sampler_logp.to(full.device)
        for name, logp in (("full", full), ("kept", kept)):
            ratio = torch.exp(behaviour_log_ratio(logp, sampler_logp).clamp(-20, 20))
            out[f"rollout/ratio_mean_{name}"] = masked_mean(ratio, mask).item()
    return out


@torch.no_grad()
def age_metrics(ages, kept, old_logp, sampler_logp, mask, queued=None) -> dict:
    """Rows that carry their age (stale samplers, replayed groups): how stale the step's rows were
    and how far their sampler was from pi_old (the proximal policy before this update):
    KL(mu || pi_old) per token on mu's samples, k1 and k3. Rows whose age is split (`queued`, the
    part spent waiting once done) add the trained rows' in-flight and in-queue parts, mean and max
    (prime-rl `off_policy/{in_flight,in_queue}/{mean,max}`)."""
    kept = torch.ones_like(ages, dtype=torch.bool) if kept is None else kept     # (replayed rows: all kept)
    kept_f = kept.to(mask.dtype)
    trained = ages[kept]
    out = {"staleness/mean_age": trained.float().mean().item() if trained.numel() else 0.0,
           "staleness/max_age": int(trained.max()) if trained.numel() else 0,
           "staleness/stale_frac": (ages > 0).float().mean().item(),
           "staleness/dropped_frac": 1.0 - kept_f.mean().item()}
    if queued is not None:
        in_queue = queued.to(ages.device)[kept]
        for name, part in (("in_flight", trained - in_queue), ("in_queue", in_queue)):
            out[f"staleness/{name}_mean"] = part.float().mean().item() if part.numel() else 0.0
            out[f"staleness/{name}_max"] = int(part.max()) if part.numel() else 0
    if old_logp is not None and sampler_logp is not None:
        log_ratio = behaviour_log_ratio(old_logp, sampler_logp)               # log pi_old - log mu
        out["staleness/behaviour_kl"] = masked_mean(-log_ratio, mask).item()
        out["staleness/behaviour_k3"] = masked_mean(torch.exp(log_ratio.clamp(-20, 20)) - log_ratio - 1, mask).item()
    return out


def peak_memory_metrics(device: torch.device) -> dict:
    """On a GPU, the most memory the step's tensors held (since the step's start resets the
    count): what micro-batches (updates.micro_batch_size, max_tokens_per_forward) bring down.
    Nothing on a CPU, where torch keeps no such count."""
    if device.type != "cuda":
        return {}
    return {"perf/peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2 ** 30}


def step_timings(started, sampled, scored, rewarded, updated, mask, sampled_tokens: int) -> dict:
    """A step's phases in seconds (perf_counter stamps) and its tokens: trained, sampled, per second."""
    tokens = mask.sum().item()
    return {"time/sample_s": sampled - started,     # generation and verifier
            "time/reference_s": scored - sampled,   # pi_ref (and pi_old) forwards
            "time/reward_s": rewarded - scored,
            "time/update_s": updated - rewarded,
            "time/step_s": updated - started,
            "perf/completion_tokens": tokens,           # trained
            "perf/sampled_tokens": sampled_tokens,      # generated, every round: + trained = the compute axis
            "perf/tokens_per_s": tokens / max(updated - started, 1e-9)}


def completion_samples(batch, rewards, count: int) -> list[dict]:
    """The first `count` completions of a step (SampledGroups), with their prompts and rewards, for samples.jsonl."""
    return [{"prompt": batch.problems[int(batch.group_index[i])].prompt, "completion": batch.texts[i],
             "reward": rewards[i].item(), "truncated": bool(batch.roll.truncated[i])}
            for i in range(min(count, len(batch.texts)))]
