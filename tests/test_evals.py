"""Sampled evals: the per-problem estimators against brute force, the eval's own draws, evals.jsonl's rows,
the protocol's refusals, and `grpo-ablate eval` re-scoring a finished run (docs/evals.md)."""
import hashlib
import itertools
import json
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from conftest import cli, cli_here, refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.evals.protocol import EvalProtocol, metric_column, parse_metric
from grpo_ablate.evals.scores import ProblemScores, read_row, tally_votes
from grpo_ablate.stats.pass_at_k import majority_at_k, pass_at_k, pass_at_k_table, pass_at_k_variance


# --------------------------------------------------------------------------- the estimators
def subsets_pass(n, c, k):
    """pass@k by brute force: the share of the k-subsets of n samples (c correct) with a correct one."""
    correct = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def subsets_majority(labels, k):
    """maj@k by brute force: over the k-subsets, the vote's outcome (a tie split evenly among the tied
    answers; a sample without an answer abstains; no vote scores 0). 'C' is the correct answer."""
    subsets = list(itertools.combinations(range(len(labels)), k))
    total = 0.0
    for s in subsets:
        votes = {}
        for i in s:
            if labels[i] is not None:
                votes[labels[i]] = votes.get(labels[i], 0) + 1
        if votes:
            top = max(votes.values())
            tied = [a for a, v in votes.items() if v == top]
            total += ("C" in tied) / len(tied)
    return total / len(subsets)


@pytest.mark.parametrize("n", range(1, 10))
def test_pass_at_k_equals_enumeration_over_all_k_subsets(n):
    for c, k in itertools.product(range(n + 1), range(1, n + 1)):
        assert pass_at_k(n, c, k) == pytest.approx(subsets_pass(n, c, k), abs=1e-13), (n, c, k)
    assert pass_at_k(n, 0, 1) == 0.0 and pass_at_k(n, n, n) == 1.0          # none and all correct
    assert pass_at_k_table(n, n).tolist() == [0.0] + [1.0] * n               # pass@n: any correct sample


def test_pass_at_k_is_exact_where_the_binomials_overflow_a_float():
    n = 1024
    for c, k in ((1, 1), (3, 512), (100, 700), (1000, 1024), (512, 512)):
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)


def test_majority_at_k_equals_enumeration_with_ties_split_and_abstentions():
    rng = random.Random(0)
    cases = [["C", "C", "w", "w"], ["C", "w", "v", None], [None, None, "C"], ["w"] * 4, ["C"] * 3,
             ["C", "w", "v", "u", "C", "w"]]
    cases += [[rng.choice(["C", "w", "v", "u", None]) for _ in range(rng.randint(1, 9))] for _ in range(150)]
    for labels in cases:
        votes = [labels.count("C")] + [labels.count(w) for w in ("w", "v", "u")]
        for k in range(1, len(labels) + 1):
            assert majority_at_k(votes, len(labels), k) == pytest.approx(subsets_majority(labels, k), abs=1e-13)
    assert majority_at_k([1, 1], 2, 2) == 0.5          # a tie of two: half
    assert majority_at_k([0, 3], 4, 1) == 0.0          # the correct answer never drawn
    assert majority_at_k([0], 3, 3) == 0.0             # nobody answered


@pytest.mark.parametrize("n, k", [(2, 1), (8, 1), (8, 2), (8, 4), (16, 8), (15, 7)])
def test_the_variance_of_pass_at_k_is_estimated_without_bias(n, k):
    """E[v̂] = Var(p̂) exactly, under a binomial draw of the n samples, for several true p."""
    for p in (0.05, 0.3, 0.5, 0.9):
        weights = np.array([math.comb(n, c) * p ** c * (1 - p) ** (n - c) for c in range(n + 1)])
        estimate = pass_at_k_table(n, k)
        truth = float(weights @ estimate ** 2 - (weights @ estimate) ** 2)
        estimated = float(weights @ np.array([pass_at_k_variance(n, c, k) for c in range(n + 1)]))
        assert estimated == pytest.approx(truth, rel=1e-9, abs=1e-15)
    assert pass_at_k_variance(8, 3, 5) is None                              # 2k > n: no unbiased estimate
    assert pass_at_k_variance(8, 3, 1) == pytest.approx(3 * 5 / (64 * 7))   # k = 1: the binomial's


def test_a_bad_k_is_refused():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="votes"):
        majority_at_k([3, 3], 4, 2)


# --------------------------------------------------------------------------- rows and summaries
def test_an_eval_row_holds_every_sample_and_its_tallies_and_reads_back():
    rng = np.random.default_rng(0)
    correct = (rng.random((7, 4)) < 0.5).astype(float)
    votes = tuple((int(c.sum()), 1) if c.sum() < 4 else (4,) for c in correct)
    scores = ProblemScores("abc", correct, votes)
    row = scores.row(10)
    assert row["n"] == 7 and row["samples"] == 4 and len(row["bits"]) == 7     # 28 bits in 7 hex digits
    back = read_row(json.loads(json.dumps(row)))
    assert np.array_equal(back.correct, correct) and back.votes == votes and back.set == "abc"
    assert back.value("avg") == correct.mean()
    assert back.value("pass", 4) == (correct.sum(axis=1) > 0).mean()
    greedy = read_row({"step": 0, "set": "s", "n": 3, "bits": "a"})            # a row from before: one sample
    assert greedy.samples == 1 and greedy.correct[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert read_row({"step": 0, "set": "s"}) is None                          # not scores: no row
    for bad, why in (({**row, "votes": [[9]] * 7}, "tally"), ({**row, "bits": "zz" * 4}, "not 7 hex digits"),
                     ({**row, "bits": "zzzzzzz"}, "`bits` is not hex"), ({**row, "bits": None, "scores": [1.0]},
                                                                          "`scores` is not 28 numbers")):
        with pytest.raises(ValueError, match=why):                            # damaged scores: said, never dropped
            read_row(bad)


def test_the_vote_puts_every_correct_answer_in_one_class():
    assert tally_votes([5, 5, 7, None, 7, 8], [True, True, False, False, False, False]) == [2, 2, 1]
    assert tally_votes([None, None], [False, False]) == [0]


def test_the_protocol_fills_in_its_defaults_and_names_its_metrics():
    sampled = EvalProtocol.from_group(compose(["eval=sampled"]).eval)
    assert (sampled.samples, sampled.temperature, sampled.pass_k, sampled.maj_k) == (8, 1.0, None, None)
    resolved = sampled.resolved(parses_answers=True)
    assert resolved.pass_k == (2, 4, 8) and resolved.maj_k == (8,)
    assert resolved.metrics() == ["eval/accuracy", "eval/pass@2", "eval/pass@4", "eval/pass@8", "eval/maj@8"]
    assert EvalProtocol("x", samples=12, temperature=0.6, pass_k=None).resolved(False).pass_k == (2, 4, 8, 12)
    assert EvalProtocol.from_group(compose(["eval=greedy"]).eval).resolved(True).metrics() == ["eval/accuracy"]
    assert EvalProtocol.from_group(compose([]).eval).name == "sampled"                  # the default (docs/default.md)
    assert [metric_column(m) for m in ("pass@8", "avg@4", "eval/maj@2", "accuracy", "reward/mean")] == [
        "eval/pass@8", "eval/accuracy", "eval/maj@2", "eval/accuracy", "reward/mean"]
    assert parse_metric("eval/pass@16") == ("pass", 16) and parse_metric("loss") is None


def test_greedy_hashes_as_every_run_before_protocols_did(monkeypatch):
    """The eval group is hashed only away from greedy, the one eval every run had before it: with eval=greedy
    the default config hashes as the default did then (f13dcf4's, model.cache_dir at its default), so those
    runs resume with it; another protocol is another config; keeping weights is not."""
    from grpo_ablate.config.identity import config_hash

    monkeypatch.delenv("GRPO_ABLATE_CACHE", raising=False)
    assert config_hash(compose(["eval=greedy"])) == "595052141b1ce1fb"
    assert config_hash(compose([])) != "595052141b1ce1fb"                              # the default is sampled
    assert config_hash(compose(["eval.keep_weights=true"])) == config_hash(compose([]))


@pytest.mark.parametrize("overrides, needle", [
    ("eval=greedy eval.samples=4", "draws the same greedy answer 4 times"),
    ("eval.temperature=0", "draws the same greedy answer 8 times"),
    ("eval=greedy eval.top_p=0.9", "eval.temperature=0 samples nothing"),
    ("eval=sampled eval.pass_k=[16]", "each k must be an integer in 1..eval.samples (8)"),
    ("eval=sampled eval.pass_k=[2.5]", "each k must be an integer"),
    ("eval=sampled eval.maj_k=[0]", "eval.maj_k=[0] is not allowed"),
    ("eval=sampled eval.temperature=-1", "eval.temperature=-1"),
    ("eval=sampled eval.samples=0", "eval.samples=0"),
    ("eval=nope", "eval=nope is not an option of config group 'eval'; allowed: greedy, sampled"),
])
def test_a_protocol_that_cannot_be_run_is_refused_in_one_line(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)


def test_eval_refuses_what_it_cannot_score_in_one_line(tmp_path):
    (tmp_path / "notes").mkdir()
    for args, needle in ((["eval", str(tmp_path / "notes")], "neither a run dir"),
                         (["eval", str(tmp_path / "nowhere")], "no such directory"),
                         (["eval", str(tmp_path / "notes"), "--steps", "some"],
                          "--steps some is not allowed; allowed: final, all"),
                         (["eval", str(tmp_path / "notes"), "--nam", "x"], "no such option: --nam"),
                         (["eval"], "give the run dir or sweep dir")):
        out = cli_here(*args, cwd=tmp_path)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.exit_code == 2 and len(lines) == 1 and needle in lines[0], (args, out.stderr)


# --------------------------------------------------------------------------- real runs
def training_view(run_dir):
    """What training computed: metrics.jsonl without the eval's columns and the timings, samples.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kept = [{k: v for k, v in r.items() if not k.startswith(("eval/", "time/", "perf/"))} for r in rows]
    return kept, (run_dir / "samples.jsonl").read_text()


@pytest.mark.fast   # two runs of the small model: changing the eval changes no training draw
def test_changing_the_eval_changes_no_training_metric_draw_or_warm_start(small, tmp_path):
    from grpo_ablate.model_source import warm_start_dir
    from grpo_ablate.tasks import build_task
    from grpo_ablate.train.grpo import train

    other = ["eval=sampled", "eval.samples=3", "eval.temperature=0.7", "eval.top_p=0.9", "eval.every=1",
             "eval.max_new_tokens=12", "eval.keep_weights=true"]
    views = []
    for name, extra in (("greedy", []), ("sampled", other)):
        cfg = compose(small + extra)
        assert train(cfg, tmp_path / name, small + extra).state == "completed"
        views.append(training_view(tmp_path / name))
        assert warm_start_dir(cfg.model, build_task(cfg.task)) == warm_start_dir(compose(small).model,
                                                                                   build_task(compose(small).task))
    assert views[0] == views[1]
    sampled = [json.loads(line) for line in (tmp_path / "sampled" / "evals.jsonl").read_text().splitlines()]
    assert [r["step"] for r in sampled] == [0, 1, 2, 3, 4] and all(r["samples"] == 3 for r in sampled)
    assert sorted(p.name for p in (tmp_path / "sampled" / "weights").iterdir()) == ["step-1", "step-2", "step-3"]


def digests(run_dir):
    """Every file of a run dir but what `grpo-ablate eval` writes (evals/): path -> sha256."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and "evals" not in p.relative_to(run_dir).parts[:1]}


def test_eval_rescores_a_run_as_it_evaluated_itself_and_touches_no_training_file(small, tmp_path):
    """A run evaluated in training under a protocol, scored again by `grpo-ablate eval` under the same
    one at every kept step: the same samples, bit for bit; its training files byte-identical; a second
    call scores nothing; the same name under other settings is refused in one line."""
    protocol = ["eval=sampled", "eval.samples=4"]
    run_dir = tmp_path / "run"
    assert cli("train", *small, *protocol, "eval.keep_weights=true", f"hydra.run.dir={run_dir}",
               cwd=tmp_path).returncode == 0
    before = digests(run_dir)
    done = cli("eval", str(run_dir), *protocol, "--steps", "all", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "[1/1] run: step 0 avg@4" in done.stdout and "3 step(s) to score" in done.stdout
    own = {json.loads(line)["step"]: json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()}
    again = [json.loads(line) for line in (run_dir / "evals" / "sampled.jsonl").read_text().splitlines()]
    assert [r["step"] for r in again] == [0, 2, 4]           # the start, the kept step 2 (eval.every=2), the last
    for row in again:
        assert row["bits"] == own[row["step"]]["bits"] and row["votes"] == own[row["step"]]["votes"]
    assert digests(run_dir) == before
    assert "0 step(s) to score" in cli_here("eval", str(run_dir), *protocol, "--steps", "all", cwd=tmp_path).stdout
    refused = cli_here("eval", str(run_dir), "eval=sampled", "eval.samples=2", cwd=tmp_path)
    assert refused.exit_code == 2 and "holds results of another protocol" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_the_draw_of_the_samples_in_a_delta_is_estimated_without_bias():
    """Two fixed policies scored with the same random numbers (as two arms of a seed are): the variance of
    Δ over many draws against the mean of paired_sampling_variance, which pairs sample i with sample i."""
    from grpo_ablate.evals.scores import paired_sampling_variance

    rng = np.random.default_rng(0)
    problems, samples = 40, 8
    qa = rng.uniform(0.1, 0.9, problems)
    qb = np.clip(qa + rng.normal(0.0, 0.15, problems), 0.02, 0.98)
    deltas, estimates = [], []
    for _ in range(4000):
        u = rng.random((problems, samples))
        a, b = (u < qa[:, None]).astype(float), (u < qb[:, None]).astype(float)
        deltas.append(a.mean() - b.mean())
        estimates.append(paired_sampling_variance([ProblemScores("s", a)], [ProblemScores("s", b)]))
    assert np.mean(estimates) == pytest.approx(np.var(deltas, ddof=1), rel=0.08)   # 4,000 draws: ~2% MC error
    unpaired = np.mean([(qa * (1 - qa) + qb * (1 - qb)).sum() / samples / problems ** 2])
    assert np.var(deltas) < 0.5 * unpaired             # the common draws' covariance, counted: far below the sum
    one = ProblemScores("s", np.ones((problems, 1)))
    assert paired_sampling_variance([one], [one]) is None                           # one sample: no within term


def test_eval_of_a_sweep_stops_on_sigterm_resumes_and_is_reported(small, tmp_path):
    """`grpo-ablate eval SWEEP_DIR` stopped by SIGTERM after its first run keeps what it scored (exit 143,
    no traceback), the same command finishes the rest, the rows equal an uninterrupted eval's, a foreign
    run dir in the sweep is refused in one line, and `report --eval` decides on the results."""
    import os
    import signal
    import subprocess
    import sys

    sweep_dir = tmp_path / "sweep"
    train = [o for o in small if not o.startswith(("steps=", "eval.every="))] + ["steps=2", "eval.every=2"]
    made = cli("sweep", "leave-one-out", "--tricks", "batch_norm", "--seeds", "2", "--no-controls",
               "--launcher", "basic", "--dir", str(sweep_dir), *train, cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    protocol = ["eval=sampled", "eval.samples=256"]                  # 18 problems x 256: a second or two a step
    runs = [sweep_dir / r["run_dir"] for r in json.loads((sweep_dir / "manifest.json").read_text())["runs"]]
    before = {d.name: digests(d) for d in runs}
    proc = subprocess.Popen([sys.executable, "-m", "grpo_ablate.cli", "eval", str(sweep_dir), *protocol],
                            cwd=tmp_path, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        for line in proc.stdout:
            if line.startswith("[1/4]"):
                break
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 143 and "interrupted: SIGTERM" in output and "Traceback" not in output, output
    scored = [d.name for d in runs if (d / "evals" / "sampled.jsonl").exists()]
    assert 1 <= len(scored) < 4
    done = cli("eval", str(sweep_dir), *protocol, cwd=tmp_path)
    assert done.returncode == 0 and "[4/4]" in done.stdout, done.stdout + done.stderr
    again = cli("eval", str(sweep_dir), *protocol, "--name", "again", cwd=tmp_path)
    assert again.returncode == 0
    for run_dir in runs:
        rows = [(run_dir / "evals" / f"{name}.jsonl").read_text() for name in ("sampled", "again")]
        assert rows[0] == rows[1] and len(rows[0].splitlines()) == 2        # the start and the final step
        assert digests(run_dir) == before[run_dir.name]                     # no training file touched
    report = cli("report", str(sweep_dir), "--eval", "sampled", "--metric", "pass@256", "--no-figures",
                 "--format", "json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    decided = json.loads(report.stdout)
    assert decided["metric"] == "eval/pass@256" and decided["eval"]["steps"] == [0, 2]
    assert decided["boundary"]["against"] == "step 0"                      # no base control: each seed's start
    config = sweep_dir / "all-s1" / "config.yaml"
    config.write_text(config.read_text().replace("id: ", "id: another-", 1))
    foreign = cli_here("eval", str(sweep_dir), *protocol, "--name", "third", cwd=tmp_path)
    assert foreign.exit_code == 2 and "is not this sweep's run" in foreign.stderr
    assert len(foreign.stderr.strip().splitlines()) == 1


def test_a_sweep_fixes_the_eval_it_decides_on_before_its_first_run(tmp_path):
    """--metric and --eval go into the manifest's decides_on (an eval after training: its settings, and
    `final`); what the runs' eval cannot give, or a sequential sweep cannot look at, is refused in one line."""
    from grpo_ablate.sweep.plan import SweepRequest, plan

    fixed = plan(SweepRequest("leave-one-out", tricks=["token_mean"], base="grpo", seeds="2", controls=False,
                              metric="pass@8", eval_name="sampled"))["decides_on"]
    assert fixed["metric"] == "eval/pass@8" and fixed["summary"] == "final" and fixed["eval"] == "sampled"
    assert fixed["eval_protocol"]["samples"] == 8 and fixed["eval_protocol"]["pass_k"] == [2, 4, 8]
    own = plan(SweepRequest("leave-one-out", tricks=["token_mean"], base="grpo", seeds="2", controls=False,
                            metric="maj@8"))
    assert own["decides_on"] == {"metric": "eval/maj@8", "summary": "last_3"}
    curve = plan(SweepRequest("leave-one-out", tricks=["token_mean"], base="grpo", seeds="2", controls=False,
                              eval_name="sampled", summary="last_3"))
    assert "eval.keep_weights=true" in curve["overrides"]              # a curve after training needs the weights
    for args, needle in ((["--metric", "pass@16"], "the runs' eval (sampled) draws 8 sample(s) per problem"),
                         (["--metric", "pass@8", "eval=greedy"], "the runs' eval (greedy) draws 1 sample(s)"),
                         (["--metric", "loss"], "--metric 'loss' is not allowed"),
                         (["--eval", "nope"], "--eval nope: eval=nope is not an option of config group 'eval'"),
                         (["--seeds", "auto", "--metric", "pass@8"], "--metric and --eval belong to a fixed")):
        out = cli_here("sweep", "leave-one-out", "--tricks", "token_mean", "--no-controls", "--dry-run", *args,
                       cwd=tmp_path)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.exit_code == 2 and len(lines) == 1 and needle in lines[0], (args, out.stderr)


def test_a_sweep_planned_before_protocols_resumes_greedy():
    """A manifest whose runs chose no eval protocol and hash as greedy was planned when greedy was the only
    eval: its resume pins eval=greedy (the sweep's overrides and each run's); one planned under the current
    default, or one that chose its protocol, is left as it is."""
    from grpo_ablate.config.identity import config_hash
    from grpo_ablate.sweep.plan import pin_planned_eval

    overrides = ["preset=grpo", "+trick=[token_mean]", "seed=0"]
    old = {"overrides": ["preset=grpo"], "runs": [
        {"overrides": list(overrides), "config_hash": config_hash(compose(["eval=greedy", *overrides]))},
        {"overrides": ["eval=sampled", *overrides], "config_hash": "x"}]}
    assert pin_planned_eval(old)
    assert old["overrides"] == ["eval=greedy", "preset=grpo"]
    assert old["runs"][0]["overrides"] == ["eval=greedy", *overrides]
    assert old["runs"][1]["overrides"] == ["eval=sampled", *overrides]               # it chose its own
    new = {"overrides": [], "runs": [{"overrides": list(overrides), "config_hash": config_hash(compose(overrides))}]}
    assert not pin_planned_eval(new) and new["runs"][0]["overrides"] == overrides


def test_a_run_from_before_protocols_resumes_with_its_greedy_eval(small, tmp_path):
    """`train --resume` of a run whose config.yaml records no eval protocol (and whose overrides chose none):
    it goes on greedy, as it started, and is refused with another protocol."""
    run_dir = tmp_path / "run"
    before = [o for o in small if o != "eval=greedy"] + ["eval=greedy"]
    assert cli("train", *before, f"hydra.run.dir={run_dir}", cwd=tmp_path).returncode == 0
    saved = (run_dir / "overrides.yaml").read_text()
    (run_dir / "overrides.yaml").write_text(saved.replace("- eval=greedy\n", ""))   # as a run from before wrote it
    config = (run_dir / "config.yaml").read_text()
    assert "name: greedy" in config
    (run_dir / "config.yaml").write_text(config.replace("  name: greedy\n", ""))      # no protocol recorded
    resumed = cli("train", "--resume", str(run_dir), "steps=6", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4, 6] and all("samples" not in r for r in rows)   # greedy all along
    refused = cli_here("train", "--resume", str(run_dir), "steps=8", "eval=sampled", cwd=tmp_path)
    assert refused.exit_code == 2 and "the config differs" in refused.stderr
