"""The statistics that the report and the sweep share: pure math on numbers, with no knowledge of
sweeps, runs or reports. Nothing here imports another grpo_ablate package, and scipy.stats only
where a rare test needs it, imported there (numpy and scipy.special otherwise).

The modules, one line each: docs/design.md#the-stats-package
"""
