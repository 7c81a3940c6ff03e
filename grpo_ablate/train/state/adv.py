"""The adv family's state: adv=rae's EMA baseline carried across steps, adv=opob's score norms, and
adv=hierarchical_grpo's episode gap (a metric only).

adv=rae (tricks/adv/reinforce.py `rae_advantage`) scores each row against an EMA of the rewards
before it; `EmaBaseline` keeps the EMA between steps: it hands the estimator the baseline the step
starts from (`estimator_input`) and moves it over the step's rewards, row by row, once the
advantages are taken (`after_advantages`). It is checkpointed with the run.

adv=opob (tricks/adv/optimal.py `opob_advantage`) weighs each row's reward by ||g_i||^2 rho_i^2,
g_i = grad_theta sum_t log pi(o_t) under the policy the step starts from (pi_old) and rho_i its
sequence importance ratio pi_old/mu. A gradient per trajectory needs a backward per trajectory:
`ScoreNorms` runs them beside the frozen forwards (`anchors`, before any update), one row at a time
and with `torch.autograd.grad`, so the optimizer's gradients are never touched, and hands the
estimator [N, 2] = (||g_i||^2, log rho_i) (`estimator_input`). VCPO does the same, one
trajectory per micro-batch. Nothing is carried across steps: nothing is checkpointed.

adv=hierarchical_grpo (tricks/adv/group.py, flag `scores_within_episodes`) takes each row's baseline over
its episode, not its group; `EpisodeGap` reports how far apart the two are (adv/episode_gap, its
activity metric) from the rewards the estimator saw. Nothing is carried across steps.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from grpo_ablate.sampling.decode import select_rows
from grpo_ablate.config.spec import RunSpec
from grpo_ablate.train.distributed import gather_rows
from grpo_ablate.train.forward import token_logprobs
from grpo_ablate.train.state import Plugin, stateful
from grpo_ablate.tricks.adv.group import episode_gap
from grpo_ablate.tricks.adv.reinforce import ema_baselines
from grpo_ablate.tricks.behaviour import log_ratio


class EmaBaseline(Plugin):
    key = "ema_baseline"

    def __init__(self, decay: float):
        self.decay, self.baseline = decay, 0.0      # prime-rl's baselines start at 0

    def estimator_input(self):
        return torch.tensor([self.baseline], dtype=torch.float64)

    def after_advantages(self, rewards) -> None:
        self.baseline = ema_baselines(rewards.double(), self.baseline, self.decay)[1]

    def metrics(self, batch) -> dict:
        return {"adv/ema_baseline": self.baseline}

    def state_dict(self) -> dict:
        return {"baseline": self.baseline}

    def load_state_dict(self, state: dict) -> None:
        self.baseline = float(state["baseline"])


@stateful("adv")
def ema_baseline(spec: RunSpec, task, policies) -> EmaBaseline | None:
    """The plugin when the adv option carries a baseline across steps, else None."""
    adv = spec.tricks["adv"]
    if not adv.option.carries_baseline:
        return None
    return EmaBaseline(float(adv.values["decay"]))


def score_norms(model, roll, temperature: float, remove_padding: bool = True,
                trained=None) -> torch.Tensor:
    """[N, 2] float64: each row's ||grad_theta sum_t log pi(o_t)||^2 over the model's trained
    parameters, and its log rho = sum_t log pi(o_t)/mu(o_t) (0 where mu is not known), the sums over
    the trained tokens: `trained` (the env_mask option: (completion_mask, sampled) -> mask) leaves a
    multi-turn episode's environment tokens out as the loss does; None: every completion token."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = torch.zeros(roll.completion_mask.shape[0], 2, dtype=torch.float64)
    with torch.enable_grad():
        for i in range(out.shape[0]):
            row = select_rows(roll, torch.tensor([i]))
            mask = (row.completion_mask if trained is None else trained(row.completion_mask, row.sampled))
            mask = mask.to(torch.float64)
            logp = token_logprobs(model, row, temperature, remove_padding=remove_padding)[0]
            grads = torch.autograd.grad((logp * mask.to(logp.dtype)).sum(), params, allow_unused=True)
            out[i, 0] = sum(float(g.double().pow(2).sum()) for g in grads if g is not None)
            if row.sampler_logprobs is not None:
                ratio = log_ratio(logp.detach().double(), row.sampler_logprobs.to(logp.device).double())
                out[i, 1] = float((ratio * mask.to(logp.device)).sum())
    return out


class ScoreNorms(Plugin):
    key = ""     # no state across steps

    def __init__(self, policy, remove_padding: bool, trained):
        self.policy, self.remove_padding, self.trained, self.values = policy, remove_padding, trained, None

    def anchors(self, part, temperature: float, forward, history) -> dict:
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.values = gather_rows(score_norms(self.policy, part, temperature, self.remove_padding, self.trained),
                                  world)
        return {}

    def estimator_input(self):
        return self.values

    def metrics(self, batch) -> dict:
        """adv/score_norm: the rows' mean ||g_i||; adv/score_norm_cv: the mean over groups of the
        coefficient of variation of ||g_i||^2 (0: the weights are equal, and OPOB is the group mean)."""
        squared, group_index = self.values[:, 0], batch.group_index
        cvs = []
        for g in group_index.unique():
            w = squared[group_index == g]
            if w.numel() > 1 and float(w.mean()) > 0:
                cvs.append(float(w.std(unbiased=False) / w.mean()))
        return {"adv/score_norm": float(squared.sqrt().mean()),
                "adv/score_norm_cv": sum(cvs) / len(cvs) if cvs else 0.0}


@stateful("adv")
def score_norm_plugin(spec: RunSpec, task, policies) -> ScoreNorms | None:
    """The plugin when the adv option reads per-trajectory score-gradient norms, else None."""
    if not spec.tricks["adv"].option.reads_score_norms:
        return None
    return ScoreNorms(policies.policy, spec.model.remove_padding, spec.tricks["env_mask"].fn)


class EpisodeGap(Plugin):
    key = ""     # no state across steps

    def __init__(self, episode_size: int):
        self.episode_size, self.rewards = episode_size, None

    def after_advantages(self, rewards) -> None:
        self.rewards = rewards.detach().double().cpu()

    def metrics(self, batch) -> dict:
        """adv/episode_gap: mean |episode mean - group mean| of the rewards (0: the baselines were the groups')."""
        if self.rewards is None:
            return {"adv/episode_gap": 0.0}
        return {"adv/episode_gap": episode_gap(self.rewards, batch.group_index.cpu(), self.episode_size)}


@stateful("adv")
def episode_gap_plugin(spec: RunSpec, task, policies) -> EpisodeGap | None:
    """The plugin when the adv option takes its baselines over episodes of a group, else None."""
    adv = spec.tricks["adv"]
    if not adv.option.scores_within_episodes:
        return None
    return EpisodeGap(int(adv.values["episode_size"]))
