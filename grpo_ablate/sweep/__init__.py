"""Sweeps: many ordinary training runs, planned as a matrix and launched through Hydra.

    matrix.py   the ablation matrix, pure Python: variants, contrasts, jobs
    launch.py   `grpo-ablate sweep`: plan, validate, launch, record, resume
    doctor.py   `grpo-ablate doctor`: which trick breaks training, in resumable stages
"""
