"""Sweeps: many ordinary training runs, planned as a matrix and launched through Hydra.

    matrix.py   the ablation matrix, pure Python: variants, contrasts, jobs
    launch.py   `grpo-ablate sweep`: plan, validate, launch, record, resume; its public
                functions (plan, start, resume, run_jobs, check_launcher, still_running,
                read_manifest, write_manifest, cpus, timestamp) are what sequential.py,
                doctor.py and the CLI use; names starting with _ stay inside the module
    doctor.py   `grpo-ablate doctor`: which trick breaks training, in resumable stages
"""
