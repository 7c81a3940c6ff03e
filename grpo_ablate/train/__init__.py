"""One training run: the GRPO loop and the no-RL controls, on one process or several.

    run.py          the run skeleton shared by every kind of run: resume, optimizer and
                    schedule, eval / checkpoint / samples schedule, status, progress
    grpo.py         `train`: the config checked and made the run spec (grpo_ablate/spec.py,
                    what every part below receives instead of the config), setup (models,
                    tricks, optimizer), then run.py's loop over `GRPOTrainer.step`
    step.py         `GRPOTrainer`: one GRPO step as named phases: sample, reference forwards,
                    rewards and advantages, update, metrics; and `diagnose`
    batch.py        how a step's batch is formed: sampling rounds, group growth, mini-batches
    state/          what a trick family remembers between steps: one module per family
                    (train/state/<family>.py), the plugin protocol and @stateful
    policy_history.py  the policy's weights k steps ago: one history for every plugin that reads it
    losses.py       the per-token loss terms by name (written once; the update and the
                    gradient diagnostics both use them)
    rewards.py      reward shaping and the reward -> advantage chain
    forward.py      the training forward: per-token log-probs (packed or padded)
    metrics.py      a step's metrics from plain tensors
    controls.py     control=base | sft: the no-RL controls
    diagnostics.py  gradient-conflict diagnostics (observation only)
    distributed.py  torchrun / SLURM data parallelism (grpo_ablate/ranks.py counts the processes)
    fsdp.py         model.fsdp=true: one model sharded over the processes
    run_log.py      what a run writes: metrics, samples, status, checkpoints, W&B
"""
