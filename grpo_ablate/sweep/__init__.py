"""Sweeps: many ordinary training runs, planned as a matrix and launched through Hydra.

    matrix.py              the ablation matrix, pure Python: variants, contrasts, jobs, seeds (the
                           Variant, Contrast and Context types are grpo_ablate/design.py's)
    contexts.py            the contexts a matrix is repeated in (--across, a file's contexts:)
    controls.py            the no-RL controls a sweep adds (untrained base, SFT)
    plan.py                what runs: a SweepRequest -> the manifest of a new sweep, every run
                           composed, validated and hashed; writes nothing
    manifest.py            the sweep dir and its manifest.json: create, read, validate, write
                           atomically, refresh the runs' statuses from their run dirs
    launch.py              starting runs: `start` and `resume` through Hydra's launchers
                           (local jobs, SLURM, Ray)
    console.py             what a sweep prints: the dry-run table, the summary, the expected wall time
    slurm.py               job states from squeue where SLURM keeps no accounting
    sequential.py          `--seeds auto`: seeds until every contrast is decided, one look at a time
    sequential_console.py  what `--seeds auto` prints: each look, each decision, the plan
    command.py             `grpo-ablate sweep` behind the CLI: its options -> a SweepRequest -> launch
                           or sequential
    doctor.py              `grpo-ablate doctor`: which trick breaks training, in resumable stages

Names starting with _ stay inside their module; what another module needs is public.
"""
