"""Multi-turn episodes: the policy's turns and the environment's replies, as one token sequence.

Each turn, the rows whose episode is still running are sampled by the rollout engine, continuing
their own token ids (the prompt, then every earlier turn and reply as the ids they were: nothing is
decoded and re-encoded on the way back, so the trained ids are the sampled ids); the turn stops at
EOS, at one of the environment's stop texts (a tool call's close) or at the per-turn token budget
(task.turn_tokens). The environment reads the turn's text and replies; its reply is encoded once and
appended as ids (a chat message: as the tokenizer's chat template renders it, sampling/chat_replies.py).
The environment decides whether a turn ended the episode, an EOS turn's too (a chat model ends a
tool-call turn with its end-of-turn token, as ms-swift's check_finished and TRL's parsed tool calls
decide); it also ends at a turn cut by the per-turn budget (as miles d583c2ae2 ends a
length-truncated turn's episode), at the turn budget (task.max_turns), when the trajectory reaches
rollout.max_new_tokens, or when the tool raises.
Every one of these is a recorded turn outcome (tasks/environment.py), never an exception.

The result is a Rollout whose completion is the whole trajectory (policy and environment tokens,
completion_mask 1 on all of them), with `sampled` (1 on the policy's tokens), `turn_index`,
`turns`, `failed_turns` and `turn_reward` (the sum of the turns' own rewards); the sampler's
log-probs are 0 on the environment's tokens. The `env_mask` family decides which of the
completion's tokens are trained (train/rewards.py).

rollout.rng=per_row (and an eval's own draws): each turn's draws are keyed by the call's seed and
the turn, a row's by its global index among the call's rows (RowNoise.rows), so a row samples the
same episode on any number of processes.
A filtering sampler (rollout.top_k|top_p|min_p) and score_centering's head record per-token fields
at each turn (the kept sets, the head ids and log-probs); the episode carries them at that turn's
tokens, with the field's fill at the environment's, which the replay reads as "not filtered".
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from grpo_ablate.sampling.chat_replies import ReplyEncoder
from grpo_ablate.sampling.decode import Rollout, RowNoise, derived_seed, left_pad
from grpo_ablate.tasks.environment import FAILED, TOOL_ERROR, TRUNCATED, TURN_BUDGET, Reply


# per-token Rollout fields a turn's sampler may record beside its ids, each [rows, T, K] (K may differ from
# turn to turn): a filtering sampler's kept sets (the sampling replay) and the sampler's top-k head
# (score_centering); an environment token has none (the field's fill)
PER_TOKEN_SAMPLER_FIELDS = ("kept_ids", "head_ids", "head_logprobs")


class MultiTurnUnsupported(ValueError):
    """A setting the multi-turn driver does not handle yet (one line for the user)."""


@dataclass
class Episode:
    prompt: list[int]
    env: object
    ids: list[int] = field(default_factory=list)        # the completion: turns and replies
    sampled: list[float] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)   # one per policy turn
    done: bool = False
    truncated: bool = False
    reward: float = 0.0
    turn_reward: float = 0.0                            # the sum of its replies' own rewards (Reply.reward)
    # what the sampler recorded per token beside the ids (PER_TOKEN_SAMPLER_FIELDS): name -> [(start, [n, K])]
    recorded: dict = field(default_factory=dict)

    def add(self, ids: list[int], sampled: bool, turn: int, logp: list[float] | None = None) -> None:
        self.ids += ids
        self.sampled += [float(sampled)] * len(ids)
        self.turn += [turn] * len(ids)
        self.logp += logp if logp is not None else [0.0] * len(ids)


def stop_ids(tokenizer, envs) -> list[int]:
    """The token ids that end a policy turn besides EOS: each environment stop text as one token."""
    out = set()
    for env in envs:
        for text in getattr(env, "stop", ()):
            ids = tokenizer(text, add_special_tokens=False).input_ids
            if len(ids) != 1:
                raise MultiTurnUnsupported(f"the environment's stop text {text!r} is {len(ids)} tokens; a turn "
                                           "stops on one token")
            out.add(ids[0])
    return sorted(out)


def run_episodes(engine, tokenizer, task, problems: list, prompts: list[list[int]], *, num_samples: int,
                 max_new_tokens: int, temperature: float, eos_id, pad_id: int, generator=None, noise=None,
                 filters=None, head: int = 0) -> tuple[Rollout, list[str], torch.Tensor]:
    """`num_samples` episodes of each problem (rows problem-major, as `generate`): the Rollout, the
    transcripts (policy turns and replies, as text) and the environments' rewards [rows].
    `filters` and `head`, as `generate` takes them: each turn records its tokens' kept sets and the
    sampler's head, which the episode carries at those tokens (none at the environment's)."""
    eos = list(eos_id) if isinstance(eos_id, (list, tuple)) else [eos_id]
    episodes = []
    for i, problem in enumerate(problems):
        for _ in range(num_samples):
            env = task.environment(problem)
            env.reset()
            episodes.append(Episode(list(prompts[i]), env))
    stops = stop_ids(tokenizer, [e.env for e in episodes])
    replies = ReplyEncoder(tokenizer)
    for turn in range(int(task.max_turns)):
        for episode in episodes:
            if not episode.done and len(episode.ids) >= max_new_tokens:   # no room left for another turn
                episode.outcomes.append(TRUNCATED)
                episode.done = episode.truncated = True
        running = [e for e in episodes if not e.done]
        if not running:
            break
        budget = min(int(task.turn_tokens), max_new_tokens - min(len(e.ids) for e in running))
        # per-row draws: keyed by the call's seed and the turn, each row by its global index (as a single
        # completion's are), so a row samples the same episode however the rows are split over processes
        turn_noise = None if noise is None else RowNoise(
            derived_seed(noise.seed, ("turn", turn)), noise.first, noise.total,
            rows=tuple(noise.first + k for k, e in enumerate(episodes) if not e.done))
        roll = engine.generate([e.prompt + e.ids for e in running], num_samples=1, max_new_tokens=budget,
                               temperature=temperature, eos_id=eos + stops, pad_id=pad_id, generator=generator,
                               noise=turn_noise, filters=filters, **({"head": head} if head else {}))
        for row, episode in enumerate(running):
            _take_turn(episode, roll, row, turn, tokenizer, replies, eos, stops, max_new_tokens)
        for episode in running:
            if not episode.done and turn == int(task.max_turns) - 1:   # its last turn was answered: no turn left
                episode.done = True
                if episode.outcomes[-1] not in FAILED:   # a failed last turn stays counted as one
                    episode.outcomes[-1] = TURN_BUDGET
    for episode in episodes:
        episode.reward = _reward(episode)
    return _rollout(episodes, pad_id, temperature > 0), [tokenizer.decode(e.ids, skip_special_tokens=True)
                                                         for e in episodes], \
        torch.tensor([e.reward for e in episodes])


def _take_turn(episode: Episode, roll: Rollout, row: int, turn: int, tokenizer, replies: ReplyEncoder,
               eos: list[int], stops: list[int], max_new_tokens: int) -> None:
    """Append row `row` of this turn's rollout to its episode, then the environment's reply."""
    n = int(roll.completion_mask[row].sum())
    ids = roll.completion_ids[row, :n].tolist()
    room = max_new_tokens - len(episode.ids)
    ids = ids[:room]                                     # the trajectory's own budget
    logp = roll.sampler_logprobs[row, :len(ids)].tolist() if roll.sampler_logprobs is not None else None
    for name in PER_TOKEN_SAMPLER_FIELDS:   # the turn's kept sets, the sampler's head: at the turn's tokens
        recorded = getattr(roll, name)
        if recorded is not None:
            episode.recorded.setdefault(name, []).append((len(episode.ids), recorded[row, :len(ids)]))
    episode.add(ids, True, turn, logp)
    if not (ids and (ids[-1] in eos or ids[-1] in stops)):   # cut by the per-turn or the trajectory budget
        episode.outcomes.append(TRUNCATED)
        episode.done = episode.truncated = True
        return
    reply = _step(episode, ids, turn, tokenizer)
    episode.outcomes.append(reply.outcome)
    if reply.reward is not None:
        episode.turn_reward += float(reply.reward)
    if reply.text and not reply.done:
        reply_ids = replies(reply.text, reply.role, ids[-1])   # encoded once (a chat message: by the template)
        if len(episode.ids) + len(reply_ids) >= max_new_tokens:   # no room for the reply and a turn after it
            episode.add(reply_ids[:max_new_tokens - len(episode.ids)], False, turn)
            episode.done = episode.truncated = True
            return
        episode.add(reply_ids, False, turn)
    episode.done = reply.done


def _step(episode: Episode, ids: list[int], turn: int, tokenizer) -> Reply:
    """The environment's reply to a turn; a tool that raises is a recorded `tool_error` ending the episode."""
    try:
        reply = episode.env.step(tokenizer.decode(ids, skip_special_tokens=True), turn)
    except Exception:   # a user's tool may raise anything: the episode ends, recorded, the run goes on
        return Reply("", done=True, outcome=TOOL_ERROR)
    return reply


def _reward(episode: Episode) -> float:
    try:
        return float(episode.env.reward())
    except Exception:   # an environment that cannot score its episode scores it 0, as a wrong answer
        return 0.0


def _rollout(episodes: list[Episode], pad_id: int, sampled_logprobs: bool) -> Rollout:
    """The episodes as one Rollout: prompts left-padded, trajectories right-padded."""
    ids, mask = left_pad([e.prompt for e in episodes], pad_id)
    n, width = len(episodes), max(1, max(len(e.ids) for e in episodes))
    completion = torch.full((n, width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((n, width))
    sampled, logp = torch.zeros((n, width)), torch.zeros((n, width))
    turn_index = torch.zeros((n, width), dtype=torch.long)
    for i, e in enumerate(episodes):
        k = len(e.ids)
        completion[i, :k] = torch.tensor(e.ids, dtype=torch.long)
        completion_mask[i, :k] = 1
        sampled[i, :k], logp[i, :k] = torch.tensor(e.sampled), torch.tensor(e.logp)
        turn_index[i, :k] = torch.tensor(e.turn, dtype=torch.long)
    return Rollout(
        **{name: _per_token_field(episodes, name, width) for name in PER_TOKEN_SAMPLER_FIELDS
           if any(name in e.recorded for e in episodes)},
        sequences=torch.cat([ids, completion], dim=1),
        attention_mask=torch.cat([mask, completion_mask.long()], dim=1),
        prompt_len=ids.shape[1], completion_mask=completion_mask,
        truncated=torch.tensor([e.truncated for e in episodes]),
        sampler_logprobs=logp if sampled_logprobs else None,
        sampled=sampled, turn_index=turn_index,
        turns=torch.tensor([len(e.outcomes) for e in episodes], dtype=torch.long),
        failed_turns=torch.tensor([sum(o in FAILED for o in e.outcomes) for e in episodes], dtype=torch.long),
        turn_reward=torch.tensor([e.turn_reward for e in episodes], dtype=torch.float32))


def _per_token_field(episodes: list[Episode], name: str, width: int) -> torch.Tensor:
    """[N, width, K] of a recorded per-token field, K its widest turn's, the field's fill elsewhere
    (the environment's tokens, padding, a narrower turn's tail)."""
    segments = [(i, start, part) for i, e in enumerate(episodes) for start, part in e.recorded.get(name, [])]
    like = segments[0][2]
    fill = next(f.metadata["fill"] for f in fields(Rollout) if f.name == name)
    out = torch.full((len(episodes), width, max(p.shape[-1] for _, _, p in segments)), fill, dtype=like.dtype)
    for i, start, part in segments:
        out[i, start:start + part.shape[0], :part.shape[-1]] = part.to("cpu")
    return out
