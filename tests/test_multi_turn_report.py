"""The report reads a multi-turn run's per-turn metrics (turns/mean, turns/failed_frac,
turns/tokens_per_turn): the tool_failures warning and the diagnostics' Turns section, on simulated
sweeps; a sweep without them reads as before."""
import pytest

from grpo_ablate.report.build import build_report
from grpo_ablate.report.health import HealthThresholds, health_flags, parse_thresholds, shown_thresholds
from grpo_ablate.report.load import metrics_frame
from grpo_ablate.report.render import render_markdown, report_json
from report_fixtures import LOO, LOO_CONTRASTS, MAX_NEW, STEPS, make_sweep, metric_rows

# a policy that fails most of its tool calls from step 5 on, retrying them until the turn budget
FAILING = {"turns__mean": lambda s: 2.0 if s < 5 else 3.0, "turns__failed_frac": lambda s: 0.1 if s < 5 else 0.8,
           "turns__tokens_per_turn": lambda s: 6.0}
# a policy that learns to call the tool: its failed turns fall, its episodes take 2 turns
LEARNING = {"turns__mean": lambda s: 1.5 + 0.5 * s / STEPS, "turns__failed_frac": lambda s: 0.4 - 0.3 * s / STEPS,
            "turns__tokens_per_turn": lambda s: 5.0}


def test_the_flag_fires_when_most_turns_fail_for_a_while():
    flags = health_flags(metrics_frame(metric_rows(**FAILING)), [], MAX_NEW)
    assert [(f.name, f.step) for f in flags] == [("tool_failures", 5)]
    assert flags[0].detail == "turns/failed_frac 0.80 > 0.5 for 3+ steps; turns/mean 3.00"
    assert health_flags(metrics_frame(metric_rows(**LEARNING)), [], MAX_NEW) == []
    # two failing steps are not yet `patience` (3) in a row; a higher threshold is not reached
    blip = dict(LEARNING, turns__failed_frac=lambda s: 0.9 if s in (3, 4) else 0.1)
    assert health_flags(metrics_frame(metric_rows(**blip)), [], MAX_NEW) == []
    assert health_flags(metrics_frame(metric_rows(**FAILING)), [], MAX_NEW,
                        parse_thresholds(["failed_turns_frac=0.9"])) == []


def test_its_threshold_is_shown_only_where_a_run_logged_the_metric():
    class Run:
        def __init__(self, columns):
            self.metrics = metrics_frame([{"step": 1, **{c: 1.0 for c in columns}}])

    assert "failed_turns_frac" not in shown_thresholds(HealthThresholds(), [Run(["policy/entropy"])])
    assert shown_thresholds(HealthThresholds(), [Run(["turns/failed_frac"])])["failed_turns_frac"] == 0.5
    with pytest.raises(Exception, match="failed_turns_frac=0"):
        parse_thresholds(["failed_turns_frac=0"])


def test_the_report_has_a_turns_line_per_arm_and_flags_the_failing_runs(tmp_path):
    variants = dict(LOO, **{name: dict(LOO[name], curves=LEARNING) for name in LOO})
    variants["drop-c"] = dict(LOO["drop-c"], curves=FAILING)
    report = build_report(make_sweep(tmp_path / "s", variants, contrasts=LOO_CONTRASTS))
    rows = {r["variant"]: r for r in report.diagnostics["turns"]}
    assert set(rows) == set(LOO) and rows["drop-c"]["flagged"] == 3 and rows["all"]["flagged"] == 0
    assert rows["all"]["turns/mean"] == {"first": pytest.approx(1.5 + 0.5 / STEPS), "last": 2.0}
    assert rows["all"]["turns/failed_frac"]["last"] == pytest.approx(0.1)
    assert rows["drop-c"]["turns/failed_frac"] == {"first": pytest.approx(0.1), "last": pytest.approx(0.8)}
    text = render_markdown(report)
    assert "## Turns" in text and "| drop-c | 3 | 2.000 -> 3.000 | 0.100 -> 0.800 | 6.000 -> 6.000 | 3 |" in text
    assert "| drop-c-s0 | tool_failures | 5 |" in text
    assert "failed_turns_frac=0.5" in text and "kl_drift and tool_failures are warnings" in text
    assert report_json(report)["diagnostics"]["turns"][0]["runs"] == 3
    # a warning: the arm whose tool calls fail is not what breaks training
    assert all("tool_failures" not in v["why"] for v in report.verdicts)


def test_a_report_without_turns_reads_as_before(tmp_path):
    text = render_markdown(build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)))
    assert "## Turns" not in text and "failed_turns_frac" not in text and "; kl_drift is a warning." in text
