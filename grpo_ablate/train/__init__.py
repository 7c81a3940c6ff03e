"""One training run: the GRPO loop and the no-RL controls, on one process or several.

    run.py          the run skeleton shared by every kind of run: resume, optimizer and
                    schedule, eval / checkpoint / samples schedule, status, progress
    grpo.py         `train`: setup, then the loop over `step.grpo_step`
    step.py         one GRPO step as named phases: sample, reference forwards, rewards and
                    advantages, update, metrics
    losses.py       the per-token loss terms by name (written once; the update and the
                    gradient diagnostics both use them) and the reward -> advantage chain
    metrics.py      a step's metrics from plain tensors
    controls.py     control=base | sft: the no-RL controls
    diagnostics.py  gradient-conflict diagnostics (observation only)
    distributed.py  torchrun / SLURM data parallelism
    ranks.py        how many processes torchrun or SLURM started (torch-free, for validation)
    run_log.py      what a run writes: metrics, samples, status, checkpoints, W&B
"""
