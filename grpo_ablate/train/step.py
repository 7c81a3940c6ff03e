"""One GRPO step, as named phases: sample, anchor forwards, rewards and advantages, update, metrics.

`GRPOTrainer.step` reads top to bottom; every trick enters through the registry (the objects
`LossTerms`, `RewardShaping` and `AdvantageChain` were made from the run spec's bound options
when the run started), so nothing here branches on a trick's name. Tricks with state of their
own (a prompt pool, a replay buffer, stale samplers, a moving reference, an older policy, the
KL and entropy controllers, the temperature) are plugins (train/state/<family>.py): the trainer
calls the active ones' hooks in a loop. What it must know about an option (it reads pi_old, greedy rewards, token
energy) is a registry flag it asks the spec for (`spec.needs`), never a family's name.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import torch

from grpo_ablate.sampling.decode import NonFiniteLogits, Rollout, derived_seed, select_rows
from grpo_ablate.sampling.engines import Rollouts
from grpo_ablate.config.spec import RunSpec
from grpo_ablate.train import diagnostics
from grpo_ablate.train.accumulation import LastPass, Update, accumulating, scaled_lr, stitched
from grpo_ablate.train.batch import SampledGroups, TaskPrompts, micro_batches, mini_batch_rows, sample_groups
from grpo_ablate.train import metrics as metrics_mod
from grpo_ablate.train.distributed import DataParallel
from grpo_ablate.train.forward import token_logprobs
from grpo_ablate.train.losses import Coefficients, LossInputs, LossTerms, loss_draws, total
from grpo_ablate.train.policy_history import policy_history, upgraded_checkpoint
from grpo_ablate.train.rewards import AdvantageChain, Advantages, RewardShaping, ShapedRewards, TurnRewards
from grpo_ablate.train.step_diagnostics import StepDiagnostics
from grpo_ablate.evals.score import evaluate
from grpo_ablate.train.run import Optimization, StepResult
from grpo_ablate.train.state import Plugin, extra_param_groups
from grpo_ablate.tricks.loss_agg import aggregate, masked_mean


@dataclass
class Policies:
    """The models of a GRPO run: the policy it trains, and the frozen ones it is anchored to."""
    policy: torch.nn.Module
    tokenizer: object
    reference: torch.nn.Module | None       # pi_ref (kl with beta > 0, or metrics.ref_kl)
    previous: torch.nn.Module | None        # pi_prev (kl=two_layer): a frozen copy, loaded from the history
    previous_lag: int                       # pi_prev's age in steps (0: no previous policy)
    value_head: torch.nn.Module | None      # the critic (adv=gae)
    start: dict | None = None               # what the run started from (models.started_from; None: not loaded)


@dataclass
class Anchors:
    """Per-token log-probs of the whole batch under the frozen policies (no gradient)."""
    ref: torch.Tensor | None = None
    old: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    prev: torch.Tensor | None = None
    energy: torch.Tensor | None = None     # pi_old's logit-gradient energy per token (an estimator that reads it)
    kept_log_mass: torch.Tensor | None = None   # log pi_old(kept set) per token (a filtering sampler)
    # a loss that centres on pi_old's top-K (clip=local): pi_old's centred log-probs psi_old [N, T], its
    # top-K ids and renormalised probabilities pbar [N, T, K], and the mass the top-K holds [N, T]
    centred: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_pbar: torch.Tensor | None = None
    topk_mass: torch.Tensor | None = None


class GRPOTrainer(StepDiagnostics):
    """The trainer of a GRPO run: its models, tricks and optimizer; `step()` is one GRPO step.
    It reads its settings from the run spec (typed, frozen; the tricks bound); what it builds
    from them (the loss, the shaping, the plugins) gets only its own part."""

    def __init__(self, spec: RunSpec, task, encode, policies: Policies, plugins: list[Plugin],
                 optim: Optimization, rollouts: Rollouts, dp: DataParallel, device: torch.device):
        self.spec, self.task, self.encode, self.dp, self.device = spec, task, encode, dp, device
        self.p, self.optim, self.rollouts = policies, optim, rollouts
        self.model, self.tokenizer = policies.policy, policies.tokenizer
        tricks = spec.tricks
        # the stateful tricks of this run's options (train/state/: `active_plugins`), and the one
        # history of the policy's weights that those reading older policies share (else None)
        self.plugins = plugins
        self.history = policy_history(self.plugins)
        self.shaping = RewardShaping(tricks, spec.reward, spec.rollout.max_new_tokens, task,
                                     self.coefficients().kl_reward)   # kl=in_reward's beta: fixed
        self.advantages = AdvantageChain(tricks)
        self.draws = loss_draws(tricks["clip"], spec.seed)   # clip_cov's seeded, checkpointed draws (else None)
        self.loss_terms = LossTerms(tricks, self.draws)
        self.prompts = TaskPrompts(task, spec.seed)       # the task's order, unless a plugin draws them
        for plugin in self.plugins:
            self.prompts = plugin.prompts(self.prompts)
        # rollout_correction: importance weights pi_old / pi_sampler of the policy loss (None: all 1); an option
        # whose ratio is the current policy's (`reads_current_policy`) is computed in the loss, per forward
        correction = tricks["rollout_correction"].option
        corrects = correction.needs_sampler_logprobs and not correction.reads_current_policy
        self.rollout_correction = tricks["rollout_correction"].fn if corrects else None
        # its weights read the loss's advantages (`reads_advantages`): computed after the advantage chain
        self.correction_reads_advantages = tricks["rollout_correction"].has("reads_advantages")
        self.weights_of = tricks["loss_agg"].option.impl   # (mask, max_len, group_index, turn_index) -> w
        # lr_scale: each optimizer step's learning-rate factor from its rows (None: the schedule's rate)
        scales_lr = tricks["lr_scale"].option.needs_sampler_logprobs
        self.lr_scale = tricks["lr_scale"].fn if scales_lr else None
        self.proximal = tricks["proximal"].fn     # pi_prox from pi_old and the sampler's log-probs
        self.greedy_baseline = spec.needs("greedy_baseline")   # the estimator reads one greedy completion a prompt
        self.token_energy = spec.needs("reads_token_energy")   # the estimator reads pi_old's per-token energy
        # the policy loss centres on pi_old's top-K (`centres_on_old_topk`): every policy forward also gives
        # the centred log-probs, pi_old's its top-`topk` support (0: none)
        clip = tricks["clip"]
        self.topk = int(clip.values["topk"]) if clip.has("centres_on_old_topk") else 0
        critic = list(policies.value_head.parameters()) if policies.value_head is not None else []
        self.trained = [p for p in policies.policy.parameters() if p.requires_grad] + critic   # LoRA: adapters
        # trained tensors outside the policy, whose gradients DDP does not average (torchrun)
        self.outside_ddp = critic + [p for g in extra_param_groups(plugins) for p in g["params"]]
        self.train_model = dp.wrap(policies.policy)   # the loss's forward: DDP under torchrun
        # model.dtype=float16: a dynamic loss scale keeps small gradients from underflowing (else off)
        self.scaler = torch.amp.GradScaler(device.type, enabled=spec.model.dtype == "float16")
        # pi_old by a separate forward only when the rollout feeds more than one optimizer step
        # (mini-batches, epochs), is truncated by a filtering sampler (its kept mass is measured on
        # pi_old), valued by a critic (V_old) or read for its token energy (both come out of that
        # forward), or an option declares it reads pi_old (`needs_old_forward`: compared with the
        # sampler, charged to the reward, sampled by an older policy); otherwise pi_old is the policy
        # itself and the ratio is exactly 1
        self.truncated_sampler = spec.rollout.filters.truncates
        self.needs_old = (spec.updates.mini_batches * spec.updates.epochs > 1 or self.truncated_sampler
                          or policies.value_head is not None or self.token_energy or spec.needs("needs_old_forward"))
        # gradient-conflict diagnostics (diag.grad_conflict=true) every diag.every steps; off: 0
        self.diag_every = spec.diag.every if spec.diag.grad_conflict else 0
        self.diag_params = (diagnostics.last_layer_params(policies.policy, spec.diag.last_layers)
                            if self.diag_every else None)
        # the template-collapse diagnostic (diag.input_dependence_every=N): at step 1 and every N steps; off: 0
        self.input_dependence_every = spec.diag.input_dependence_every
        # model.remove_padding: every forward below runs the sequences packed, without padding
        self.remove_padding = spec.model.remove_padding
        # rollout.sampling_replay: every forward below scores the sampler's kept sets, renormalised
        self.score_kept_sets = spec.rollout.score_kept_sets
        self.skipped_steps = 0
        self.eval_problems = task.eval_set()
        self.started = time.perf_counter()   # time/elapsed_s: wall clock since the run (re)started here

    # ------------------------------------------------------------------ the step
    def step(self, step: int) -> StepResult:
        started = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)   # perf/peak_memory_gib: this step's
        self.model.train()
        T = float(torch.as_tensor(self.temperature()).detach())     # this step's sampling temperature (a number)
        try:
            batch = self.sample(step, T)                                           # 1. sample and score
        except NonFiniteLogits as err:
            return StepResult(None, diverged=f"{err} at step {step}")
        part = select_rows(batch.roll, self.dp.share(len(batch.texts)))          # this rank's rows
        sampled = time.perf_counter()
        anchors = self.anchor_logprobs(part, T)                                   # 2. frozen forwards
        scored = time.perf_counter()
        shaped, adv, inputs, mismatch = self.rewards_and_advantages(batch, anchors, step)   # 3. rewards -> advantages
        rewarded = time.perf_counter()
        coef = self.coefficients()
        diag = self.diagnose(batch, shaped, adv, inputs, coef) if self.diag_due(step) else {}
        # the completions under other prompts, at the weights they were sampled with (before the update)
        elsewhere = self.score_under_other_prompts(batch) if self.input_dependence_due(step) else None
        update = self.update(batch, part, inputs, coef, step)                     # 4. optimizer step(s)
        updated = time.perf_counter()
        diag.update(self.input_dependence(batch, elsewhere, anchors, update))
        metrics = {"step": step, "loss": update.loss,                             # 5. metrics
                   **self.metrics(batch, shaped, adv, anchors, update, T), **mismatch, **diag,
                   **metrics_mod.step_timings(started, sampled, scored, rewarded, updated, shaped.mask,
                                               batch.sampled_tokens),
                   "time/elapsed_s": updated - self.started, **metrics_mod.peak_memory_metrics(self.device)}
        if not update.finite and self.spec.on_nonfinite == "stop":
            what = "loss" if not math.isfinite(update.loss) else "grad norm"
            return StepResult(metrics, diverged=f"non-finite {what} at step {step}")
        return StepResult(metrics, samples=metrics_mod.completion_samples(batch, adv.rewards,
                                                                          self.spec.schedule.samples_per_log))

    # ------------------------------------------------------------------ phases
    def sample(self, step: int, T: float) -> SampledGroups:
        """The step's groups (`sample_groups`) from the run's prompt source, by this step's
        sampler (the policy itself, unless a plugin samples otherwise: staleness); then each
        plugin's say on the batch (a replay buffer refills the groups without reward variance)."""
        if self.history is not None:
            self.history.push(self.model)      # the weights this step starts from: age 0
        sampler = self.rollouts
        for plugin in self.plugins:
            sampler = plugin.sampler(sampler, self.model, self.history)
        rollout = self.spec.rollout
        batch = sample_groups(sampler, self.prompts, rollout.prompts_per_step, rollout.group_size,
                              self.spec.tricks["sampling"], step, T)
        for plugin in self.plugins:
            batch = plugin.after_sampling(batch, step, self.rollouts.pad_id)
        return batch

    def token_logprobs(self, model, roll: Rollout, T, value_head=None, entropy_grad: bool = False,
                       energy: bool = False, kept_mass: bool = False, topk: int = 0, head: bool = False):
        """(log-probs, entropy, values[, energy][, kept mass][, centred log-probs, top-K ids, pbar, mass][, head
        log-probs]) of a rollout under `model` (train/forward.py), its rows forwarded in the update's
        micro-batches (see pieces) and stitched back."""
        return stitched([token_logprobs(model, select_rows(roll, piece), T, value_head, entropy_grad,
                                        remove_padding=self.remove_padding, energy=energy,
                                        score_kept_sets=self.score_kept_sets, kept_mass=kept_mass, topk=topk,
                                        head=head)
                         for piece in self.pieces(roll)])

    def pieces(self, roll: Rollout) -> list[slice]:
        """The micro-batches of a rollout's rows: updates.micro_batch_size completions and
        updates.max_tokens_per_forward real tokens at most (one slice, all rows, when unset)."""
        updates = self.spec.updates
        return micro_batches(roll.attention_mask.sum(dim=1).tolist(), updates.micro_batch_size,
                             updates.max_tokens_per_forward)

    @torch.no_grad()
    def anchor_logprobs(self, part: Rollout, T: float) -> Anchors:
        """pi_ref's log-probs (when a KL term or metric needs them), pi_old's and V_old (when
        needed, see needs_old) and the plugins' (kl=two_layer: pi_prev), gathered to the whole batch."""
        p, dp, out = self.p, self.dp, Anchors()
        if p.reference is not None:
            out.ref = dp.gather_rows(self.token_logprobs(p.reference, part, T)[0])
        if self.needs_old:
            old, _, values, *extra = self.token_logprobs(p.policy, part, T, p.value_head, energy=self.token_energy,
                                                         kept_mass=self.truncated_sampler, topk=self.topk)
            out.old, out.old_values = dp.gather_rows(old), dp.gather_rows(values)
            out.energy = dp.gather_rows(extra.pop(0)) if self.token_energy else None
            out.kept_log_mass = dp.gather_rows(extra.pop(0)) if self.truncated_sampler else None
            if self.topk:
                out.centred, out.topk_ids, out.topk_pbar, out.topk_mass = map(dp.gather_rows, extra)
        forward = lambda model, roll, temperature: dp.gather_rows(self.token_logprobs(model, roll, temperature)[0])
        for plugin in self.plugins:
            out = replace(out, **plugin.anchors(part, T, forward, self.history))
        return out

    def rewards_and_advantages(self, batch: SampledGroups, anchors: Anchors, step: int):
        """Shaped rewards, their advantages (reward_norm -> adv -> adv_clip; the reward's parts
        for an estimator that reads them), the loss's inputs and the sampler-mismatch metrics of
        rollout_correction, whose weights are computed once on the whole batch (as verl does): before
        the advantages (an estimator may read them), or after them for an option whose weights read
        the advantages (`reads_advantages`).
        Stale rollouts: rows dropped as too old are masked out, and pi_old becomes the `proximal`
        family's pi_prox (recompute: pi_old itself) before the loss and the weights read it."""
        group_index = batch.group_index.to(self.device)
        shaped = self.shaping(batch.scores.to(self.device), batch.texts, batch.roll, group_index,
                              anchors.old, anchors.ref)
        if batch.roll.kept is not None:
            kept = batch.roll.kept.to(self.device)
            shaped = replace(shaped, keep=shaped.keep & kept, mask=shaped.mask * kept[:, None])
        if batch.trained is not None:   # groups the sampling option masks out of the loss (variance_mass), before
            # the advantage as verl's filter does; `keep` stays the shaping's (overlong/masked_frac counts only that)
            shaped = replace(shaped, mask=shaped.mask * batch.trained.to(self.device)[:, None])
        sampler = batch.roll.sampler_logprobs
        sampler = sampler.to(self.device) if sampler is not None else None
        old, mismatch = anchors.old, {}
        if old is not None and sampler is not None:
            ages = batch.roll.ages if batch.roll.ages is not None else torch.zeros(len(batch.texts), dtype=torch.long)
            old, mismatch = self.proximal(old, sampler, ages.to(self.device)[:, None], shaped.mask)
        weights = None
        corrects = self.rollout_correction is not None and sampler is not None
        if corrects and not self.correction_reads_advantages:
            weights, corrected = self.rollout_correction(old, sampler, shaped.mask)
            mismatch = {**mismatch, **corrected}
        values = self.estimator_input(batch, anchors, weights, step)
        adv = self.advantages(shaped.rewards, group_index, shaped.mask, values, shaped.components,
                              TurnRewards.of(batch.roll, self.device), turn_index=batch.roll.turn_index)
        if corrects and self.correction_reads_advantages:   # its mask reads the advantages the loss will
            weights, corrected = self.rollout_correction(old, sampler, shaped.mask, advantages=adv.per_token)
            mismatch = {**mismatch, **corrected}
        for plugin in self.plugins:
            plugin.after_advantages(adv.rewards)
        returns = (self.advantages.critic_returns(adv.rewards, shaped.mask, anchors.old_values, batch.roll.turn_index)
                   if self.p.value_head is not None else None)
        head = batch.roll.head_logprobs   # the sampler's top-k head (score_centering reads it)
        inputs = LossInputs(shaped.mask, adv.per_token, old, anchors.ref, anchors.prev,
                            anchors.old_values, returns, sampler, weights, old_centred=anchors.centred,
                            topk_ids=anchors.topk_ids, topk_pbar=anchors.topk_pbar, topk_mass=anchors.topk_mass,
                            sampler_head=head.to(self.device) if head is not None else None)
        return shaped, adv, inputs, mismatch

    def estimator_input(self, batch: SampledGroups, anchors: Anchors, weights, step: int):
        """What the advantage estimator reads beside the rewards (`values`): ReMax's greedy rewards,
        OTB's per-token energy (times the rollout-correction weight squared, verl's rho-bar^2), a plugin's
        (a baseline carried across steps), or V_old."""
        for plugin in self.plugins:
            given = plugin.estimator_input()
            if given is not None:
                return given.to(self.device)
        if self.greedy_baseline:
            return self.greedy_rewards(batch, step)
        if self.token_energy:
            return anchors.energy if weights is None else anchors.energy * weights ** 2
        return anchors.old_values

    @torch.no_grad()
    def greedy_rewards(self, batch: SampledGroups, step: int) -> torch.Tensor:
        """[rows] the reward of the policy's greedy completion of each row's prompt (ReMax's baseline)."""
        greedy = self.rollouts(batch.problems, 1, 0.0, ("greedy", step))
        wrong, correct = float(self.spec.reward.wrong), float(self.spec.reward.correct)
        return (wrong + (correct - wrong) * greedy.scores).to(self.device)[batch.group_index.to(self.device)]

    def temperature(self):
        """The temperature this step samples at and scores at (1 unless a plugin sets it; a
        tensor in the graph when it is trained)."""
        T = 1.0
        for plugin in self.plugins:
            T = plugin.temperature(T)
        return T

    def coefficients(self) -> Coefficients:
        """This step's weights of the terms: the plugins' (the KL and entropy controllers), the critic's."""
        given = {name: weight for plugin in self.plugins for name, weight in plugin.coefficients().items()}
        value = float(self.spec.tricks["adv"].values["value_coef"]) if self.p.value_head is not None else 0.0
        return Coefficients(**given, value=value)

    def update(self, batch: SampledGroups, part: Rollout, inputs: LossInputs, coef: Coefficients,
               step: int) -> Update:
        """updates.epochs passes over the rollout, each in updates.mini_batches optimizer steps
        on disjoint slices of whole groups (verl's PPO mini-batches; one slice, one pass: a single
        step on the whole batch). Each step: the gradient of this rank's rows of the slice
        (`accumulate`: in micro-batches), its loss the terms' sum aggregated with the slice's own
        loss_agg weights (verl's agg_loss per mini-batch; global over ranks, so the ranks' losses
        add up), then grad-norm clip and AdamW. The LR schedule steps once per rollout."""
        updates, dp, max_new = self.spec.updates, self.dp, self.spec.rollout.max_new_tokens
        turns = batch.roll.turn_index   # [N, T] each token's turn (None: one a row), for loss_agg=turn_mean
        means, last, ok = metrics_mod.StepMeans(), LastPass(inputs.mask), True
        for epoch in range(updates.epochs):
            shuffle = derived_seed(self.spec.seed, ("mini_batches", step, epoch)) if updates.shuffle else None
            for rows in mini_batch_rows(batch.group_index, updates.mini_batches, shuffle):
                mb = inputs if rows is None else inputs.rows(rows)
                mine = slice(None) if rows is None else rows[dp.share(len(rows))]
                roll = part if rows is None else select_rows(batch.roll, mine)
                weights = self.weights_of(mb.mask, max_new, batch.group_index if rows is None else
                                          batch.group_index[rows.cpu()],
                                          turns if rows is None or turns is None else turns[rows.to(turns.device)])
                scale, scaled = self.lr_scale(mb.old_logp, mb.sampler_logp, mb.mask) if self.lr_scale else (1.0, {})
                with scaled_lr(self.optim.optimizer, scale):
                    loss, (logp, entropy, values, stats) = self.accumulate(
                        roll, mb.rows(dp.share(len(mb.mask))), dp.part(weights), coef, step)
                    loss, grad_norm, ok = self.optimizer_step(loss)
                for plugin in self.plugins:
                    plugin.after_optimizer_step(self.optim.optimizer)   # ref_sync: every N optimizer steps
                logp, entropy, values = dp.gather_rows(logp), dp.gather_rows(entropy), dp.gather_rows(values)
                means.add(loss, grad_norm, {**metrics_mod.token_means(
                    {k: dp.gather_rows(v) for k, v in stats.items()}, mb.mask),
                    **metrics_mod.ratio_metrics(logp, mb.old_logp, mb.mask),
                    **({"optim/lr_scale": scale, **scaled} if self.lr_scale else {})})
                last.put(rows, logp, entropy, values)
                if not ok:
                    break
            if not ok:
                break
        if ok:
            self.optim.schedule.step()                 # once per rollout, as verl does
        for plugin in self.plugins:
            plugin.after_update(self.optim.optimizer)
        self.rollouts.engine.sync(self.p.policy)   # rollout=vllm: the sampler gets the new weights
        loss, grad_norm = means.optimizer()
        return Update(loss, grad_norm, ok, means.steps, last.logp, last.entropy, last.values, means.tokens())

    def accumulate(self, roll: Rollout, mine: LossInputs, weights, coef: Coefficients, step: int):
        """(this rank's loss of one mini-batch, the forwards' (log-probs, entropy, values, token
        statistics)): the policy's forward and backward on this rank's rows `roll` in micro-batches
        (T in the graph: a learnable temperature is trained through the policy loss), each loss
        the sum of w * l over its rows with the mini-batch's weights `weights`, so the gradients
        that add up in .grad are the unsplit one's. token_mask's choice is made over the whole
        mini-batch first (one more forward, only when split)."""
        pieces, dp, scaler = self.pieces(roll), self.dp, self.scaler
        if len(pieces) > 1 and self.loss_terms.token_mask is not None:
            with torch.no_grad():
                entropy = self.token_logprobs(self.p.policy, roll, self.temperature())[1]
            mine = replace(mine, token_keep=self.loss_terms.token_keep(entropy, mine.mask, dp))
        self.optim.optimizer.zero_grad(set_to_none=True)
        loss, outputs = 0.0, []
        head = self.loss_terms.reads_sampler_head   # the log-probs of the sampler's head ids too (score_centering)
        for i, piece in enumerate(pieces):
            rows = mine.rows(piece)
            support = None if rows.topk_ids is None else (rows.topk_ids, rows.topk_pbar)   # pi_old's top-K
            logp, entropy, values, *rest = token_logprobs(
                self.train_model, select_rows(roll, piece), self.temperature(), self.p.value_head,
                entropy_grad=coef.entropy > 0, remove_padding=self.remove_padding,
                score_kept_sets=self.score_kept_sets, topk=self.topk, support=support, head=head)
            centring = rest[:4] if self.topk > 0 else []      # clip=local's psi, ids, pbar, mass
            terms, stats = self.loss_terms(logp, entropy, values, rows, coef, dp,
                                           centred=centring[0] if centring else None,
                                           head_logp=rest[-1] if head else None)
            if centring:   # how much of pi_old its top-K holds (verl's local_topk_mass): whether K is enough
                stats["clip/topk_mass"] = centring[3] if rows.topk_mass is None else rows.topk_mass
            piece_loss = aggregate(total(terms), weights[piece])
            if step == self.spec.schedule.nan_loss_at_step:   # fault injection: a divergence
                piece_loss = piece_loss * float("nan")
            with accumulating(self.train_model, last=i == len(pieces) - 1):
                scaler.scale(piece_loss * dp.world).backward()   # DDP (FSDP) averages over ranks: x world = the sum
            loss = loss + piece_loss.detach()
            outputs.append((logp.detach(), entropy.detach(), None if values is None else values.detach(),
                            {name: value.detach() for name, value in stats.items()}))   # value/loss holds a graph
        return loss, stitched(outputs)

    def optimizer_step(self, loss) -> tuple[float, float, bool]:
        """AdamW on one mini-batch's accumulated gradients: (the loss over ranks, grad norm, go on?).
        A non-finite loss or gradient is skipped with on_nonfinite=skip, else it stops the run."""
        spec, dp, optimizer, scaler = self.spec, self.dp, self.optim.optimizer, self.scaler
        dp.average_grads(self.outside_ddp)             # a value head, a learnable T (torchrun only)
        scaler.unscale_(optimizer)                     # float16 only: the true gradients, before clipping
        grad_norm = dp.clip_grad_norm(self.trained, spec.optim.max_grad_norm)
        step_loss = dp.sum(float(loss))                # the whole mini-batch's loss
        # (float16: an overflowing gradient is routine; the scaler skips it, lowers its scale)
        finite = math.isfinite(step_loss) and (math.isfinite(grad_norm) or scaler.is_enabled())
        if not finite and spec.on_nonfinite == "skip":
            self.skipped_steps += 1    # drop this update, keep the weights as they were
            optimizer.zero_grad(set_to_none=True)
            scaler.update()
            return step_loss, grad_norm, True
        if not finite:
            return step_loss, grad_norm, False
        scaler.step(optimizer)                         # optimizer.step(), unless float16 overflowed
        scaler.update()
        return step_loss, grad_norm, True

    # ------------------------------------------------------------------ metrics, samples, state
    @torch.no_grad()
    def metrics(self, batch: SampledGroups, shaped: ShapedRewards, adv: Advantages, anchors: Anchors,
                update: Update, T: float) -> dict:
        """This step's metrics; then the plugins see them (an adaptive controller updates from what it measured)."""
        rollout, mask, m = self.spec.rollout, shaped.mask, metrics_mod
        group_index = batch.group_index.to(self.device)
        out = {**m.reward_metrics(batch.scores, adv.rewards, group_index, shaped.components["overlong_reward"],
                                  shaped.keep, shaped.components["length_reward"]),
               **m.sampling_metrics(batch.rounds, len(batch.problems), len(batch.texts),
                                    rollout.prompts_per_step, rollout.group_size, batch.drawn),
               "temperature/value": T,
               **m.completion_metrics(batch.roll.lengths, batch.roll.truncated),
               **(m.turn_metrics(batch.roll, mask) if batch.roll.turns is not None else {}),   # multi-turn episodes
               **m.advantage_metrics(adv.values, mask, adv.clipped_frac, adv.outcome),
               "policy/entropy": masked_mean(update.entropy, mask).item(), **update.step_means,
               "ppo/optimizer_steps": update.steps,
               "optim/grad_norm": update.grad_norm,
               "optim/lr": self.optim.schedule.get_last_lr()[0], "optim/skipped_steps": self.skipped_steps,
               **m.kl_metrics(update.logp, anchors.ref, anchors.prev, mask)}
        if anchors.energy is not None:
            out["adv/token_energy"] = masked_mean(anchors.energy, mask).item()
        if update.values is not None:
            out.update(m.critic_metrics(update.values, self.advantages.critic_returns(
                adv.rewards, mask, anchors.old_values, batch.roll.turn_index), mask))
        # the sampler's log-probs vs ours, where they can differ: vLLM, or rollout.dtype below the trainer's
        if batch.roll.sampler_logprobs is not None and (rollout.backend == "vllm" or rollout.dtype != "float32"):
            out.update(m.sampler_gap_metrics(batch.roll.sampler_logprobs,
                                             update.logp if anchors.old is None else anchors.old, mask))
        if batch.roll.kept_ids is not None:
            out.update(m.kept_size_metrics(batch.roll.kept_ids, mask))
        if anchors.kept_log_mass is not None:
            out.update(m.kept_set_metrics(anchors.kept_log_mass, anchors.old, batch.roll.sampler_logprobs,
                                          mask, self.score_kept_sets))
        if batch.trained is not None:
            out.update(m.masked_group_metrics(batch.trained, batch.scores, batch.group_index))
        for plugin in self.plugins:
            out.update(plugin.metrics(batch))
        if batch.roll.ages is not None:
            sampler = batch.roll.sampler_logprobs
            out.update(m.age_metrics(batch.roll.ages, batch.roll.kept, anchors.old,
                                         None if sampler is None else sampler.to(self.device), mask,
                                         queued=batch.roll.queued))
        for plugin in self.plugins:
            plugin.after_metrics(out, rows=adv.rewards.numel())
        return out

    def evaluate(self, step: int) -> dict:
        return evaluate(self.p.policy, self.rollouts, self.eval_problems, self.spec.eval, seed=self.spec.seed,
                        step=step, max_new_tokens=self.spec.schedule.eval_max_new_tokens,
                        answer=getattr(self.task, "answer", None))

    def checkpointed(self) -> dict:
        """The objects with state of their own, by their checkpoint key."""
        return {**({"value_head": self.p.value_head} if self.p.value_head is not None else {}),
                **({"loss_draws": self.draws} if self.draws is not None else {}),
                **({"grad_scaler": self.scaler} if self.scaler.is_enabled() else {}),
                **({"policy_history": self.history} if self.history is not None else {}),
                **{plugin.key: plugin for plugin in self.plugins if plugin.key}}

    def checkpoint_weights(self) -> dict | None:
        return self.dp.full_weights(self.model)     # FSDP: gathered to rank 0; else None (whole already)

    def state_dict(self) -> dict:
        return {**self.optim.state_dict(), "skipped_steps": self.skipped_steps,
                **{name: obj.state_dict() for name, obj in self.checkpointed().items()}}

    def load_state_dict(self, state: dict) -> None:
        self.optim.load_state_dict(state)
        state = upgraded_checkpoint(state)   # one written before the one history of weights reads as one
        for name, obj in self.checkpointed().items():
            obj.load_state_dict(state[name])
        self.skipped_steps = state["skipped_steps"]
