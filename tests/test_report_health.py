"""Health flags of one run, on metrics and samples built to fire (or not fire) each flag.
"""
from grpo_ablate.report.build import build_report
from grpo_ablate.report.health import Flag, HealthThresholds, health_flags
from grpo_ablate.report.load import metrics_frame
from grpo_ablate.report.render import render_markdown
from report_fixtures import LOO, LOO_CONTRASTS, MAX_NEW, make_sweep, metric_rows


def frame(**curves):
    return metrics_frame(metric_rows(**curves))


def names(flags):
    return [(f.name, f.step) for f in flags]


HEALTHY_SAMPLES = [{"step": s, "prompt": f"{a}+{s}=", "completion": f"{a}+{s % 10}={a + s % 10};{a + s}",
                    "reward": 1.0, "truncated": False} for s in (10, 20, 30, 40) for a in (1, 2, 3, 4)]


def test_healthy_run_raises_no_flag():
    th = HealthThresholds()
    # entropy halves, KL rises a little, lengths grow a little: all normal
    df = frame(policy__entropy=lambda s: 0.8 - 0.01 * s, kl__k3=lambda s: 0.002 * s,
               length__mean=lambda s: 12 + s / 10, length__truncated_frac=lambda s: 0.05)
    assert health_flags(df, HEALTHY_SAMPLES, MAX_NEW, th) == []
    assert health_flags(df, [], None, th) == []          # no samples, no cap known
    assert health_flags(metrics_frame([]), [], MAX_NEW, th) == []


def test_diverged_flag():
    df = metrics_frame(metric_rows(diverge_at=12))
    assert names(health_flags(df, [], MAX_NEW)) == [("diverged", 12)]
    status = {"state": "diverged", "step": 9, "reason": "non-finite logits at step 9"}
    flags = health_flags(frame(), [], MAX_NEW, status=status)
    assert flags == [Flag("diverged", 9, "non-finite logits at step 9")]


def test_entropy_collapse_flag():
    collapse = lambda s: 0.8 if s < 20 else 0.05                 # below 0.1 x 0.8 from step 20 on
    assert names(health_flags(frame(policy__entropy=collapse), [], MAX_NEW)) == [("entropy_collapse", 20)]
    blip = lambda s: 0.05 if s in (20, 21) else 0.8              # two low steps < patience 3
    assert health_flags(frame(policy__entropy=blip), [], MAX_NEW) == []
    loose = HealthThresholds(entropy_collapse_frac=0.01)
    assert health_flags(frame(policy__entropy=collapse), [], MAX_NEW, loose) == []


def test_length_blowup_flag():
    to_cap = lambda s: 12.0 if s < 15 else 31.0                   # 31 >= 0.95 x 32
    assert names(health_flags(frame(length__mean=to_cap), [], MAX_NEW)) == [("length_blowup", 15)]
    assert health_flags(frame(length__mean=to_cap), [], None) == []   # no cap known, no truncation
    truncating = lambda s: 0.6 if s >= 25 else 0.1
    flags = health_flags(frame(length__truncated_frac=truncating), [], MAX_NEW)
    assert names(flags) == [("length_blowup", 25)] and "truncated_frac 0.60" in flags[0].detail


def test_repetition_flag():
    repeater = [dict(r, completion="1+1=2," * 8) if r["step"] >= 30 else r for r in HEALTHY_SAMPLES]
    flags = health_flags(frame(), repeater, MAX_NEW)
    assert names(flags) == [("repetition", 30)] and "distinct-2" in flags[0].detail
    same = [dict(r, completion="5+5=10;10") if r["step"] >= 20 else r for r in HEALTHY_SAMPLES]
    flags = health_flags(frame(), same, MAX_NEW)
    assert names(flags) == [("repetition", 20)] and "4 of 4 different prompts" in flags[0].detail
    # one prompt answered the same way four times is a converged policy, not a repeater
    one_prompt = [dict(r, prompt="2+2=", completion="2+2=4;4") for r in HEALTHY_SAMPLES]
    assert health_flags(frame(), one_prompt, MAX_NEW) == []


def test_kl_drift_flag():
    drift = lambda s: 0.01 * s                                     # > 0.1 from step 11 to the end
    flags = health_flags(frame(kl__k3=drift), [], MAX_NEW)
    assert names(flags) == [("kl_drift", 11)] and "kl/k3" in flags[0].detail
    back = lambda s: 0.3 if 10 <= s < 30 else 0.02                 # rises, then comes back
    assert health_flags(frame(kl__k3=back), [], MAX_NEW) == []
    settling = lambda s: 0.5 - 0.005 * s                           # above, but falling: 0.5 -> 0.3
    assert health_flags(frame(kl__k3=settling), [], MAX_NEW) == []
    no_k3 = metrics_frame([{k: v for k, v in r.items() if k != "kl/k3"} | {"kl/k1": drift(r["step"])}
                           for r in metric_rows()])
    assert names(health_flags(no_k3, [], MAX_NEW)) == [("kl_drift", 11)]


def test_flags_reach_the_report(tmp_path):
    entropy = {"policy__entropy": lambda s: 0.8 if s < 20 else 0.01}
    variants = dict(LOO, **{"drop-c": dict(LOO["drop-c"], curves=entropy)})
    report = build_report(make_sweep(tmp_path / "s", variants, contrasts=LOO_CONTRASTS))
    text = render_markdown(report)
    assert "| drop-c-s0 | entropy_collapse | 20 |" in text
    # c's runs collapse without it, so c is not what breaks training; the numbers decide
    assert {v["trick"]: v["verdict"] for v in report.verdicts}["c"] == "hurts"
    assert "entropy_collapse×3" in text


