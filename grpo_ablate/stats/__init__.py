"""The statistics that the report and the sweep share: pure math on numbers (numpy, and scipy's
special functions; scipy.stats only where a rare test needs it, imported there), with no
knowledge of sweeps, runs or reports. Nothing here imports another grpo_ablate package.

    student.py           Student's t quantile and upper tail (scipy.special, not scipy.stats)
    intervals.py         Estimate; a mean and a Δ with 95% intervals: paired on seeds (snapped to
                         the eval's grid, widened by the eval set's noise) or Welch's, once
    error_control.py     adjusting a family of p-values (Holm, Benjamini–Hochberg); Holm's rejections
    exact.py             exact tests on 2x2 tables of runs: Fisher's, Boschloo's
    group_sequential.py  the group-sequential paired t-test of `--seeds auto` (spending, boundaries,
                         deciding, simulating) and a fixed design's power and seeds needed
    aggregate.py         rliable's IQM and probability of improvement, stratified bootstrap intervals
    drift_null.py        the plateau null of the drift test (report/drift.py)

The report (grpo_ablate/report) keeps what is about reports: which numbers are compared, the
verdicts and their wording, the tables and pictures.
"""
