"""What a step measures on the side, without changing its update: the gradient-conflict diagnostics
(train/diagnostics.py) and the template-collapse diagnostic (train/input_dependence.py). GRPOTrainer
(train/step.py) inherits them; they read its bound tricks and policies. autograd.grad accumulates
nothing into .grad and each forward restores the RNG, so a step trains exactly as it does with them off.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import replace

import torch

from grpo_ablate.sampling.decode import select_rows
from grpo_ablate.train import diagnostics, input_dependence
from grpo_ablate.train.accumulation import Update
from grpo_ablate.train.batch import SampledGroups
from grpo_ablate.train.losses import Coefficients, LossInputs
from grpo_ablate.train.rewards import Advantages, ShapedRewards
from grpo_ablate.tricks.loss_agg import aggregate


class StepDiagnostics:
    """The diagnostics' phases of GRPOTrainer.step (observation only)."""

    def diag_due(self, step: int) -> bool:
        return bool(self.diag_every) and step % self.diag_every == 0

    def diagnose(self, batch: SampledGroups, shaped: ShapedRewards, adv: Advantages, inputs: LossInputs,
                 coef: Coefficients) -> dict:
        """Gradient-conflict diagnostics on a sub-batch (diag.rows completions) and this step's
        weights: the gradient, w.r.t. the last diag.last_layers blocks, of each loss term alone
        and of the policy term driven by each reward component alone (through the same
        reward_norm -> adv -> adv_clip chain), the policy term's token factor the update's
        (token_mask's quantile over the whole batch, not the sub-batch). Logs grad_norm/<term>
        and grad_cos/<a>__<b>.
        autograd.grad accumulates nothing into .grad and the RNG is restored, so the update is
        exactly the one it is with diagnostics off."""
        started = time.perf_counter()
        group_index = batch.group_index.to(self.device)
        # a critic's baseline is for the whole reward: no per-component split with one
        component_adv = {} if self.p.value_head is not None else diagnostics.component_advantages(
            shaped.components, lambda reward: self.advantages(reward, group_index, shaped.mask).values)
        informative = torch.stack([inputs.advantages.flatten(1).ne(0).any(1),
                                   *(a.ne(0) for a in component_adv.values())]).any(0)
        rows = diagnostics.pick_rows(group_index, informative, self.spec.diag.rows)
        policy = self.p.policy
        with torch.random.fork_rng(devices=[policy.device] if policy.device.type == "cuda" else []):
            head = self.loss_terms.reads_sampler_head
            logp, entropy, values, *head_logp = self.token_logprobs(policy, select_rows(batch.roll, rows),
                                                                    self.temperature(), self.p.value_head,
                                                                    entropy_grad=coef.entropy > 0, head=head)
        weights = self.weights_of(shaped.mask, self.spec.rollout.max_new_tokens, batch.group_index,   # the batch's
                                  batch.roll.turn_index)
        w = weights[rows] * (weights.sum() / weights[rows].sum().clamp(min=1e-12))   # the full loss's total
        sub = self.whole_batch_token_keep(batch, inputs).rows(rows)
        with self.draws.unchanged() if self.draws is not None else contextlib.nullcontext():
            terms, _ = self.loss_terms(logp, entropy, values, sub, coef, head_logp=head_logp[0] if head else None)
            terms = {name: aggregate(term, w) for name, term in terms.items()}
            factor = self.loss_terms.policy_factor(logp, entropy, sub)[0]   # the same token factor as the policy term's
            for name, component in component_adv.items():
                terms[name] = aggregate(self.loss_terms.policy(logp, sub.old_logp, component[rows][:, None], sub.mask,
                                                               factor, sub.sampler_logp)[0], w)
        out = diagnostics.conflict_metrics(diagnostics.term_gradients(terms, self.diag_params))
        out["time/diag_s"] = time.perf_counter() - started   # part of time/update_s
        return out

    def input_dependence_due(self, step: int) -> bool:
        return bool(self.input_dependence_every) and (step == 1 or step % self.input_dependence_every == 0)

    @torch.no_grad()
    def score_under_other_prompts(self, batch: SampledGroups):
        """(the sub-batch's rows, their log-probs [n, T] under another group's prompt, the seconds it
        took), by the policy as it sampled them (train/input_dependence.py); None with one group.
        No gradient, the RNG restored: the step trains exactly as it does with the diagnostic off."""
        started = time.perf_counter()
        rows = input_dependence.pick_rows(batch.group_index, self.spec.diag.input_dependence_rows)
        donors = input_dependence.other_prompt_rows(batch.group_index, rows)
        if donors is None:
            return None
        policy = self.p.policy
        with torch.random.fork_rng(devices=[policy.device] if policy.device.type == "cuda" else []):
            logp = self.token_logprobs(policy, input_dependence.with_prompts_of(batch.roll, rows, donors),
                                       self.temperature())[0]
        return rows, logp, time.perf_counter() - started

    def input_dependence(self, batch: SampledGroups, elsewhere, anchors, update: Update) -> dict:
        """diag/input_dependence(_seq) from the completions' log-probs under their own prompt, pi_old's
        (its own forward when there is one, else the update's: then pi_old is the policy, one optimizer
        step on the whole batch), against `elsewhere`'s; {} when not due."""
        if elsewhere is None:
            return {}
        rows, other, seconds = elsewhere
        own = (anchors.old if anchors.old is not None else update.logp)[rows.to(self.device)]
        roll = batch.roll   # over the tokens the run trains on (a multi-turn episode's: env_mask's)
        mask = self.shaping.env_mask(roll.completion_mask, roll.sampled)[rows.to(roll.completion_mask.device)]
        mask = mask.to(own.device)
        return {**input_dependence.input_dependence_metrics(own, other, mask),
                "time/input_dependence_s": seconds}   # its forward: part of time/update_s

    @torch.no_grad()
    def whole_batch_token_keep(self, batch: SampledGroups, inputs: LossInputs) -> LossInputs:
        """`inputs` with token_mask's kept tokens chosen over the whole batch, as the update's
        (one mini-batch) are, not over the diagnostics' sub-batch: one more forward, only with a
        token_mask option that selects tokens."""
        if self.loss_terms.token_mask is None:
            return inputs
        policy = self.p.policy
        with torch.random.fork_rng(devices=[policy.device] if policy.device.type == "cuda" else []):
            entropy = self.token_logprobs(policy, batch.roll, self.temperature())[1]
        return replace(inputs, token_keep=self.loss_terms.token_keep(entropy, inputs.mask))
