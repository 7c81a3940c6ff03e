"""Before any trick verdict, whether training beats its untrained start, per context
(report/training.py). Synthetic sweeps whose truth is known (tests/training_sim.py): the headline
names the context where training lowers the metric and the one where it raises it; the checks
are a family of their own, so the trick contrasts' error rate stays what the report states, and
the checks' own false calls stay within theirs (simulated through the report's functions, which
`grpo-ablate report` is checked to agree with)."""
import json
import math

import numpy as np
import pytest

from conftest import cli_here
from grpo_ablate.report.build import build_report
from grpo_ablate.report.render import render_markdown
from training_sim import fast_checks, simulate_contexts, write_context_sweep

DECIDED = ("helps", "hurts")


def head(report, lines=8):
    """The report's top: the title, the lines above the verdict table and its first rows."""
    return "\n".join(render_markdown(report).splitlines()[:lines])


def training_part(report):
    """The section below the verdicts that gives each context's test in full."""
    return render_markdown(report).split("## Does training beat its untrained start?")[1].split("\n## ")[0]


def test_the_first_lines_name_the_context_where_training_lowers_the_metric(tmp_path):
    path, _, _ = write_context_sweep(tmp_path / "s", np.random.default_rng(1), training={"down": -1.5, "up": 1.0})
    report = build_report(path)
    text = head(report)
    assert text.splitlines()[3].startswith("- **Training vs its untrained start** (2 tests, Holm, 5%")
    assert "**training lowers eval/accuracy in down: " in text and "**training raises eval/accuracy in up: " in text
    assert "every variant ends below its start" in text.splitlines()[3]
    full = render_markdown(report)
    assert full.index("in down") < full.index("contrasts decided**") < full.index("| trick |")  # before any verdict
    part = training_part(report)                                    # in full, below the verdicts
    assert "**training lowers eval/accuracy in down: " in part and "**training raises eval/accuracy in up: " in part
    assert "the trick contrasts there compare ways of getting worse" in part
    assert "What usually causes this, and what to try (suggestions, not verdicts)" in part
    assert "length cap: rollout.max_new_tokens=32" in part
    down, up = report.training["contexts"]
    assert (down["context"], down["verdict"], down["without"]) == ("down", "hurts", "control-base@down")
    assert down["all_worse"] and down["advice"] and not up["advice"] and up["verdict"] == "helps"
    assert report.training["family"]["tests"] == 2 and down["start"] == pytest.approx(up["start"], abs=0.2)
    saved = json.loads(json.dumps(report.training, default=str))
    assert saved["contexts"][0]["context"] == "down"


def test_a_sweep_where_training_helps_everywhere_says_so(tmp_path):
    path, _, _ = write_context_sweep(tmp_path / "s", np.random.default_rng(2), training={"a": 1.5, "b": 1.5})
    report = build_report(path)
    text = head(report)
    assert "**training raises eval/accuracy in a: " in text and "**training raises eval/accuracy in b: " in text
    assert "Fix the training set-up" not in text
    part = training_part(report)
    assert "Training beats its untrained start in every context" in part
    assert "ways of getting worse" not in part and "suggestions, not verdicts" not in part


def test_without_a_base_control_the_runs_own_step_0_is_the_start(tmp_path):
    """--no-controls: the same test against each reference run's own eval at step 0 (the same
    weights, before the first update), paired on seeds and problems."""
    path, _, _ = write_context_sweep(tmp_path / "s", np.random.default_rng(1), control=False,
                                     training={"down": -1.5, "up": 1.0})
    with_control, _, _ = write_context_sweep(tmp_path / "c", np.random.default_rng(1),
                                             training={"down": -1.5, "up": 1.0})
    report, reference = build_report(path), build_report(with_control)
    down = report.training["contexts"][0]
    assert down["without"] == "step 0" and down["verdict"] == "hurts"
    assert "- **Training vs its runs' own step-0 eval (no base control)**" in head(report)
    assert "its runs' own eval at step 0 (no base control)" in training_part(report)
    # the start is the same eval set answered the same way, so the test is the same one
    assert down["delta"].mean == pytest.approx(reference.training["contexts"][0]["delta"].mean, abs=1e-12)
    assert down["delta"].p == pytest.approx(reference.training["contexts"][0]["delta"].p, rel=1e-9)


def test_a_sweep_planned_before_the_check_has_no_such_section(tmp_path):
    path, _, _ = write_context_sweep(tmp_path / "s", np.random.default_rng(1), control=False)
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["checks_training"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    report = build_report(path)
    assert report.training is None and "Does training beat" not in render_markdown(report)


def test_the_cli_decides_as_the_functions_do(tmp_path):
    """The simulation below runs through the report's functions; `grpo-ablate report` on the same
    sweep (run dirs, evals.jsonl, manifest) gives the same verdicts and adjusted p-values."""
    path, plan, scores = write_context_sweep(tmp_path / "s", np.random.default_rng(5),
                                             training={"down": -0.6, "up": 0.4}, effects={"t0": 1.0})
    done = cli_here("report", path, "--no-figures", "--format", "json", cwd=path.parent)
    assert done.exit_code == 0, done.stdout
    got = json.loads((path / "report.json").read_text())
    training, tricks = fast_checks(plan, scores)
    for c in got["training"]["contexts"]:
        assert c["verdict"] == training[c["context"]]["verdict"]
        assert c["delta"]["p_adjusted"] == pytest.approx(training[c["context"]]["delta"].p_adjusted, rel=1e-9)
    for v in got["verdicts"]:
        assert v["verdict"] == tricks[v["trick"]]["verdict"]
        assert v["delta"]["p_adjusted"] == pytest.approx(tricks[v["trick"]]["delta"].p_adjusted, rel=1e-9)
    assert (path / "report.md").read_text().splitlines()[3].startswith("- **Training vs its untrained start**")


@pytest.mark.parametrize("sweeps", [pytest.param(200, marks=pytest.mark.full),
                                    pytest.param(2000, marks=pytest.mark.slow)])
def test_the_checks_add_nothing_to_the_trick_contrasts_error_rate(sweeps):
    """Two contexts, training lowers the metric in one and raises it in the other, no trick has
    an effect: the share of reports naming any false trick *helps*/*hurts* stays ≤ 5% (Holm over
    the 4 contrasts, as the report states), with the training checks on. And with training
    doing nothing on average in both contexts, the share of reports whose checks call training
    better or worse than its start stays ≤ 5% (Holm over the 2 checks, as stated). Measured
    rates: docs/controls.md."""
    rng = np.random.default_rng(36)
    trick_false = check_false = check_found = 0
    for _ in range(sweeps):
        training, tricks = fast_checks(*simulate_contexts(rng, training={"down": -1.0, "up": 1.0}))
        trick_false += any(v["verdict"] in DECIDED for v in tricks.values())
        check_found += training["down"]["verdict"] == "hurts" and training["up"]["verdict"] == "helps"
        null_training, _ = fast_checks(*simulate_contexts(rng, training={"a": 0.0, "b": 0.0}))
        check_false += any(v["verdict"] in DECIDED for v in null_training.values())
    se = math.sqrt(0.05 * 0.95 / sweeps)
    assert trick_false / sweeps <= 0.05 + 2 * se
    assert check_false / sweeps <= 0.05 + 2 * se
    assert check_found / sweeps > 0.6      # and power against a real ±1 logit change (80% measured)


def test_a_sweep_without_contexts_tests_once_and_says_so_plainly(tmp_path):
    """The same check for a sweep without contexts (here with no base control: the runs' own
    step 0); a drop that the test does not decide is said plainly, as not decided, with no advice."""
    from report_sim import write_sweep

    path, _ = write_sweep(tmp_path / "s", np.random.default_rng(3), tricks=2, seeds=3)
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "checks_training": True}))
    report = build_report(path)
    [check] = report.training["contexts"]
    assert check["context"] is None and check["without"] == "step 0" and check["verdict"] == "no evidence"
    assert "**in this sweep, training is not shown to change" in head(report)
    text = training_part(report)
    assert "one test (1 test, Holm, 5%" in text and "**in this sweep, training is not shown to change" in text
    assert "(by 0.011 on average; not decided)" in text and "ways of getting worse" not in text
    assert not check["advice"] and "suggestions, not verdicts" not in text
