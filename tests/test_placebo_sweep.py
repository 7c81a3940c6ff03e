"""The A/A sweep (`sweep aa`): placebos that differ from the reference only by their own sampling
stream, planned as a leave-one-out's contrasts, and the report's check that it names none."""
import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import cli_here
from report_sim import write_sweep
from grpo_ablate.config.compose import compose
from grpo_ablate.config.identity import config_hash
from grpo_ablate.report.build import build_report
from grpo_ablate.report.render import render_markdown
from grpo_ablate.sampling.decode import sampler_seed
from grpo_ablate.design import STREAM_SALT
from grpo_ablate.sweep.matrix import SweepError
from grpo_ablate.sweep.modes import build_matrix

FAMILIES = {"clip_higher": "clip", "token_mean": "loss_agg"}


def test_aa_is_the_reference_then_each_placebo_with_its_own_salt():
    m = build_matrix("aa", ["clip_higher", "token_mean"], FAMILIES, placebos=3)
    assert [v.name for v in m.variants] == ["all", "placebo-1", "placebo-2", "placebo-3"]
    reference = m.variants[0]
    for i, v in enumerate(m.variants[1:], 1):
        assert v.tricks_on == reference.tricks_on and v.reference == "all"
        assert v.overrides == (*reference.overrides, f"{STREAM_SALT}={i}")
    assert [(c.trick, c.with_, c.without) for c in m.contrasts] == [(f"placebo-{i}", "all", f"placebo-{i}")
                                                                     for i in (1, 2, 3)]
    assert len(build_matrix("aa", [], FAMILIES).variants) == 7   # six placebos unless told
    with pytest.raises(SweepError, match="placebos"):
        build_matrix("aa", [], FAMILIES, placebos=0)


def test_the_planned_placebos_differ_from_the_reference_only_by_the_salt(cache_dir):
    from grpo_ablate.sweep.plan import SweepRequest, plan

    manifest = plan(SweepRequest(mode="aa", seeds="2", mode_options={"placebos": 2}, overrides=["steps=3"]))
    assert [v["name"] for v in manifest["variants"]] == ["all", "placebo-1", "placebo-2"]   # no controls unasked
    assert {c["trick"] for c in manifest["contrasts"]} == {"placebo-1", "placebo-2"}
    configs = {}
    for run in manifest["runs"]:
        cfg = OmegaConf.to_container(compose(run["overrides"]))
        cfg.pop("run"), cfg.pop("sweep")   # the labels every run has its own of
        configs[(run["variant"], run["seed"])] = cfg
    for (variant, seed), cfg in configs.items():
        reference = configs[("all", seed)]
        salt = 0 if variant == "all" else int(variant.split("-")[1])
        assert cfg["rollout"].pop("stream_salt") == salt
        assert cfg == {**reference, "rollout": {k: v for k, v in reference["rollout"].items() if k != "stream_salt"}}


def test_the_salt_leaves_old_runs_as_they_were_and_gives_a_placebo_its_own_stream():
    assert sampler_seed(7, 0) == 7 and sampler_seed(7, 1) != sampler_seed(7, 2) != 7
    plain, zero, one = (config_hash(compose(o)) for o in ([], [f"{STREAM_SALT}=0"], [f"{STREAM_SALT}=1"]))
    assert plain == zero != one   # hashed only away from 0: a run from before the salt resumes


def test_aa_dry_run_prints_the_placebos_and_writes_nothing(tmp_path, cache_dir):
    r = cli_here("sweep", "aa", "--placebos", "3", "--seeds", "2", "--dry-run", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert "4 variants x 2 seeds" in r.stdout and "control" not in r.stdout
    assert all(f"placebo-{i}" in r.stdout and f"{STREAM_SALT}={i}" in r.stdout for i in (1, 2, 3))
    assert list(tmp_path.iterdir()) == []
    other = cli_here("sweep", "leave-one-out", "--placebos", "2", "--dry-run", cwd=tmp_path)
    assert other.exit_code == 2 and "--placebos belongs to `sweep aa`" in other.output
    salted = cli_here("sweep", "aa", f"{STREAM_SALT}=1", "--dry-run", cwd=tmp_path)
    assert salted.exit_code == 2 and "--placebos" in salted.output


def test_an_aa_report_on_null_data_names_no_placebo_and_says_so(tmp_path):
    path, _ = write_sweep(tmp_path / "aa", np.random.default_rng(1), mode="aa", tricks=6, seeds=5)
    report = build_report(path)
    section = report.placebo
    assert section["placebos"] == 6 and section["named"] == [] and section["held"]
    assert section["chance"] == pytest.approx(0.05)
    chosen = next(f for f in section["floors"] if f["chosen"])
    assert chosen["sd"] > 0 and chosen["detectable"] > chosen["sd"]   # 5 seeds resolve about 1.7 SDs
    text = render_markdown(report)
    assert "A/A check passed: no placebo named" in text.splitlines()[2]
    assert "## A/A check" in text and "noise floor" in text
    # what the report's own test detects (its model, Holm's level), beside the single unadjusted t's number
    own = section["own_detectable"]
    assert own and own == sorted(v["power"]["detectable_effect"] for v in report.verdicts)
    assert own[0] > chosen["detectable"]               # six tests under Holm resolve less than one at 5%
    assert f"detects |Δ| ≥ {own[0]:.4f}" in text.split("## A/A check")[1]


def test_an_aa_report_that_names_a_placebo_says_how_often_that_happens_by_chance(tmp_path):
    """A 'placebo' with a real effect stands in for the 5% of A/A sweeps that name one by chance."""
    path, _ = write_sweep(tmp_path / "aa", np.random.default_rng(1), mode="aa", tricks=6, seeds=5,
                          effects={"t0": 2.0})
    report = build_report(path)
    assert [p["placebo"] for p in report.placebo["named"]] == ["t0"] and not report.placebo["held"]
    assert ("A/A check: 1 placebo(s) named" in render_markdown(report)
            and "expected in ~5% of A/A reports; rerun with fresh seeds" in render_markdown(report))


def test_a_leave_one_out_report_has_no_aa_section(tmp_path):
    path, _ = write_sweep(tmp_path / "loo", np.random.default_rng(1), tricks=2, seeds=3)
    report = build_report(path)
    assert report.placebo is None and "A/A" not in render_markdown(report)


# ------------------------------------------------------------------------------ determinism
def test_first_difference_names_the_metric_and_step_and_ignores_timings():
    from grpo_ablate.sweep.determinism import first_difference

    rows = [{"step": 0, "eval/accuracy": 0.5}, {"step": 1, "loss": 0.25, "time/step_s": 0.1, "perf/tokens_per_s": 9.0}]
    same = [dict(r) for r in rows]
    same[1].update({"time/step_s": 0.3, "perf/tokens_per_s": 3.0})
    assert first_difference(rows, same) is None
    off = [dict(r) for r in rows]
    off[1]["loss"] = 0.25 + 1e-16 * 2 ** 3   # the last bits: still a difference
    assert "`loss` first differs at step 1" in first_difference(rows, off)
    assert "2 rows and the second 1" in first_difference(rows, rows[:1])
    assert first_difference([{"step": 1, "x": float("nan")}], [{"step": 1, "x": float("nan")}]) is None


def test_determinism_passes_on_a_repeated_run_and_fails_naming_the_metric_of_a_perturbed_copy(tmp_path, small):
    import json
    import shutil

    from conftest import cli
    from grpo_ablate.sweep.determinism import compare_runs

    out = cli("sweep", "aa", "--determinism", "--seeds", "1", "--dir", tmp_path / "d", *override(small, "steps=2"),
              cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "determinism check passed" in out.stdout
    first, copy = tmp_path / "d" / "first", tmp_path / "copy"
    shutil.copytree(tmp_path / "d" / "second", copy)
    rows = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    rows[2]["policy/entropy"] = rows[2]["policy/entropy"] + 1e-9
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert compare_runs(first, copy).startswith(f"`policy/entropy` first differs at step {rows[2]['step']}")


def override(base, *extra):
    """`base` overrides with the keys set in `extra` replaced."""
    keys = {e.split("=", 1)[0] for e in extra}
    return [o for o in base if o.split("=", 1)[0] not in keys] + list(extra)
