"""The command line's options: each command's flags, defaults and help, as typer declares them.

cli.py's command signatures name these (`tricks_: Optional[str] = opt.SWEEP_TRICKS`), so a
command reads as the request it parses and what it hands that to; `grpo-ablate CMD --help`
prints the help written here. Named <COMMAND>_<PARAMETER>.
"""
import typer

# train
TRAIN_RESUME = typer.Option(
    None, "--resume", help="Continue the run in this run dir from its last checkpoint.")
TRAIN_RESTART = typer.Option(False, "--restart", help="With --resume: start the run over from step 0 (one "
    "that stopped before its first checkpoint, or whose checkpoint is damaged); "
    "a finished run is never restarted.")

# sweep
SWEEP_MODE = typer.Argument(
    None, help="leave-one-out | add-one-in | ladder | factorial | pairwise | conflict | aa | file PATH")
SWEEP_TRICKS = typer.Option(None, "--tricks", help="Named tricks, comma separated (default for "
    "leave-one-out: the seed review's recommended set, dynamic_sampling, "
    "no_std).")
SWEEP_PLACEBOS = typer.Option(None, "--placebos", help="aa: placebo variants beside the reference, each "
    "differing from it only by its own sampling stream (default 6).")
SWEEP_DETERMINISM = typer.Option(False, "--determinism", help="aa: instead of the sweep, train its reference's "
    "first seed twice and check that metrics.jsonl is bit-identical (timings aside); exit 1 naming the first "
    "metric and step that differ.")
SWEEP_TRICK = typer.Option(None, "--trick", help="conflict: the new trick (any named trick).")
SWEEP_REWARD = typer.Option(None, "--reward", help="conflict: the new reward term, a named trick "
    "whose option adds a term to the reward (e.g. length_penalty, overlong_punish; a wrong one is "
    "refused with the list).")
SWEEP_BASE = typer.Option(None, "--base", help="Preset the tricks are added to (grpo, dapo, ...).")
SWEEP_SEEDS = typer.Option(None, "--seeds", help="5 = seeds 0..4; or a list: 0,5,9; or auto: "
    "3, then one more per look until each contrast is decided (default 5).")
SWEEP_MAX_SEEDS = typer.Option(None, "--max-seeds",
    help="--seeds auto: at most this many seeds (default 8).")
SWEEP_BUDGET = typer.Option(None, "--budget",
    help="--seeds auto: start no look past this wall time (90m, 2h).")
SWEEP_EFFECT = typer.Option(None, "--effect", help="--seeds auto: the smallest Δ that matters; "
    "a contrast whose repeated 95% interval lies inside ±X stops as "
    "'no effect >= X'.")
SWEEP_SUMMARY = typer.Option(None, "--summary", help="What the sweep decides on, fixed in its manifest "
    "before the first run (and what --seeds auto looks at): final, auc, best, "
    "last_k or last_<k>, as report --summary [last_3].")
SWEEP_LAUNCHER = typer.Option(None, "--launcher", help="basic | joblib | submitit_local | "
    "submitit_slurm | ray (default joblib).")
SWEEP_JOBS = typer.Option(None, "--jobs", help="Runs at a time (default: one per core).")
SWEEP_FAMILY = typer.Option(None, "--family", help="factorial over a config group's "
    "options (adv) or a key's values (task.level, key=a,b); repeatable.")
SWEEP_ACROSS = typer.Option(None, "--across", help="Repeat the whole matrix in contexts: "
    "KEY=v1,v2 (task.level=easy,hard, reward.wrong=0,-1, "
    "model=tiny,tiny_aligned); repeatable: every combination.")
SWEEP_MAX_RUNS = typer.Option(None, "--max-runs", help="Refuse sweeps with more runs (default 128).")
SWEEP_STEPS = typer.Option(None, "--steps", help="Training steps of every run.")
SWEEP_NAME = typer.Option(None, "--name", help="Sweep name (W&B group prefix, dir name).")
SWEEP_OUT = typer.Option(None, "--dir", help="Sweep dir (default runs/sweeps/<name>-<time>).")
SWEEP_CONTROLS = typer.Option(None, "--controls/--no-controls", help="Add the no-RL controls "
    "(untrained base, supervised run); default: on for the embedded model.")
SWEEP_CONTROL_BUDGET = typer.Option(None, "--control-budget", help="The SFT control's budget: "
    "tokens (B x G solutions a step) or wall (the treatments' median "
    "training time; runs after them). Default tokens.")
SWEEP_DRY_RUN = typer.Option(False, "--dry-run", help="Print the matrix, write nothing.")
SWEEP_ALLOW_INERT = typer.Option(False, "--allow-inert", help="Run tricks under test that cannot act "
    "with these settings (refused by default; see `grpo-ablate tricks`).")
SWEEP_RESUME_DIR = typer.Option(None, "--resume", help="Continue this sweep dir.")
SWEEP_RERUN = typer.Option(None, "--rerun", help="--resume: start these runs over, comma separated "
    "(e.g. all-s0; their old dirs are kept aside).")

# doctor
DOCTOR_TRICKS = typer.Option(None, "--tricks", help="Candidate tricks, comma separated "
    "(default: the seed review's recommended set on --base grpo).")
DOCTOR_BASE = typer.Option(None, "--base", help="Preset the tricks are added to (grpo, dapo, ...).")
DOCTOR_STEPS = typer.Option(None, "--steps", help="Training steps of every run (default 30: short).")
DOCTOR_SEEDS = typer.Option(None, "--seeds", help="Seeds per set: 1 (default), 2 = 0,1, or 0,5.")
DOCTOR_LAUNCHER = typer.Option(None, "--launcher",
    help="basic | joblib | submitit_local | ... (default joblib).")
DOCTOR_JOBS = typer.Option(None, "--jobs", help="Runs at a time (default: one per core).")
DOCTOR_MAX_RUNS = typer.Option(None, "--max-runs", help="Stop the search before more runs (default 32).")
DOCTOR_THRESHOLD = typer.Option([], "--threshold", help="Health-flag threshold NAME=VALUE (repeatable).")
DOCTOR_OUT = typer.Option(None, "--dir", help="Doctor dir (default runs/doctor/<time>).")
DOCTOR_DRY_RUN = typer.Option(False, "--dry-run", help="Print the first stages, write nothing.")
DOCTOR_ALLOW_INERT = typer.Option(False, "--allow-inert", help="Search tricks that cannot act with these "
    "settings (refused by default).")
DOCTOR_RESUME_DIR = typer.Option(None, "--resume", help="Continue this doctor dir.")
DOCTOR_LINT = typer.Option(None, "--lint", help="List the pair rules (settings that change what a trick "
    "means) that hold in this sweep file's runs; nothing is run. Exit 1 when one holds that the file does "
    "not expect (expected_pairs).")

# tricks
TRICKS_FMT = typer.Option("table", "--format", help="table, json or md")

# report
REPORT_SWEEP_DIR = typer.Argument(..., help="A sweep dir (manifest.json + one run dir per variant and seed).")
REPORT_METRIC = typer.Option("eval/accuracy", "--metric", help="Metric to compare (eval/accuracy or eval_accuracy).")
REPORT_SUMMARY = typer.Option(
    None, "--summary", help="How a run's curve becomes the number compared: final, auc (compute-weighted "
    "mean over training), best, last_k (mean of the last k evals; or last_<k>) [final].")
REPORT_LAST_K = typer.Option(None, "--last-k", help="k of --summary last_k [3].")
REPORT_COMPUTE = typer.Option("tokens", "--compute", help="The x axis of auc and the fits: tokens (sampled + "
    "trained) or wall (seconds of the training steps).")
REPORT_PREDICT_FROM = typer.Option(
    None, "--predict-from", help="Also predict every verdict from this fraction of each run's steps (0-1), "
    "beside the measured ones (a sweep still running is predicted anyway).")
REPORT_FMT = typer.Option("md", "--format", help="What to print: md, csv or json (all three are written).")
REPORT_OUT = typer.Option(None, "--out", help="Where report.md/.csv/.json and the PNGs go [SWEEP_DIR].")
REPORT_WATCH = typer.Option(
    None, "--watch", help="Refresh every SECONDS (30 when none given) until every run has finished.")
REPORT_THRESHOLD = typer.Option(
    [], "--threshold", help="Health-flag threshold NAME=VALUE (repeatable); names in docs/report.md, Health flags.")
REPORT_LOWER_IS_BETTER = typer.Option(False, "--lower-is-better", help="The metric is a cost (e.g. a length).")
REPORT_EFFECT = typer.Option(None, "--effect", help="The smallest Δ that matters: a CI inside ±X is "
    "'no effect', and the power section sizes seeds for it.")
REPORT_ERROR_CONTROL = typer.Option(
    "holm", "--error-control", help="How the report's tests are adjusted together: holm (the chance of any false "
    "helps/hurts/breaks-training in the report ≤ alpha), bh (Benjamini–Hochberg: false discovery rate ≤ alpha) "
    "or none (each contrast at alpha on its own).")
REPORT_TEST = typer.Option(
    "blocked", "--test", help="How each contrast is tested: blocked (a sweep's star families, e.g. leave-one-out's "
    "all vs each drop, as one block design with seeds as blocks and moderated variances: docs/statistics.md) or "
    "paired (a paired t per contrast, its own n − 1 df; the report shows it as a sensitivity line).")
REPORT_ALPHA = typer.Option(0.05, "--alpha", help="The report's error level (family-wise for holm, FDR for bh).")
REPORT_CONFLICT_THRESHOLD = typer.Option(
    -0.1, "--conflict-threshold", help="Gradient cosine below which two terms conflict (at > half the steps).")
REPORT_FIGURES = typer.Option(True, "--figures/--no-figures", help="Draw the PNG figures (the slow part of a "
    "report: ~2 s); --no-figures writes the text files only.")
REPORT_USE_WANDB = typer.Option(False, "--wandb", help="Also log table and figures to a W&B summary run.")
REPORT_WANDB_REPORT = typer.Option(False, "--wandb-report", help="Also build a W&B Report (online only).")
