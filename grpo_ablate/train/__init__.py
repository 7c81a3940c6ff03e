"""One training run: the GRPO loop and the no-RL controls, on one process or several.

    run.py          the run skeleton shared by every kind of run: resume, optimizer and
                    schedule, eval / checkpoint / samples schedule, status, progress
    grpo.py         `train`: setup (models, tricks, optimizer), then run.py's loop over
                    `GRPOTrainer.step`
    step.py         `GRPOTrainer`: one GRPO step as named phases: sample, reference forwards,
                    rewards and advantages, update, metrics; and `diagnose`
    losses.py       the per-token loss terms by name (written once; the update and the
                    gradient diagnostics both use them)
    rewards.py      reward shaping and the reward -> advantage chain
    forward.py      the training forward: per-token log-probs (packed or padded)
    reference_sync.py  ref_sync: when the frozen reference moves toward the policy
    metrics.py      a step's metrics from plain tensors
    controls.py     control=base | sft: the no-RL controls
    diagnostics.py  gradient-conflict diagnostics (observation only)
    distributed.py  torchrun / SLURM data parallelism (grpo_ablate/ranks.py counts the processes)
    fsdp.py         model.fsdp=true: one model sharded over the processes
    run_log.py      what a run writes: metrics, samples, status, checkpoints, W&B
"""
