"""Verdicts across contexts: the matrix in every context, the transfer verdicts, their error
rate, the claims table, and the sweep command's context input."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from conftest import cli, cli_here
from grpo_ablate.report.build import build_report
from grpo_ablate.report.render import render_markdown
from grpo_ablate.stats.error_control import holm
from grpo_ablate.stats.intervals import delta_ci
from grpo_ablate.report.claims import AGREES, CONTRADICTS, NOT_TESTED, UNDECIDED_HERE, context_tags, judge
from grpo_ablate.report.transfer import (CONTEXT_DEPENDENT, HOLDS, SIGN_FLIPS, UNDECIDED, Cell, transfer_verdicts,
                                         welch_p)
from grpo_ablate.report.scaling import RAISES, SAME_CEILING
from grpo_ablate.report.verdicts import HELPS, HURTS, INERT, NO_EVIDENCE, decide_by_delta
from grpo_ablate.design import Context
from grpo_ablate.sweep.contexts import across_contexts, check_contexts, file_contexts, with_contexts
from grpo_ablate.sweep.matrix import SweepError
from grpo_ablate.sweep.modes import build_matrix, variants_matrix
from report_fixtures import make_sweep

FAMILIES = {"no_std": "adv", "token_mean": "loss_agg", "clip_higher": "clip", "batch_norm": "adv"}


# ------------------------------------------------------------------------------ the matrix in contexts
def test_across_is_every_combination_of_the_keys_values():
    contexts = across_contexts(["task.level=easy,hard", "reward.wrong=0,-1"])
    assert [c.name for c in contexts] == ["level-easy.wrong-0", "level-easy.wrong--1", "level-hard.wrong-0",
                                          "level-hard.wrong--1"]
    assert contexts[1].overrides == ("task.level=easy", "reward.wrong=-1")
    assert [c.name for c in across_contexts(["model=tiny,tiny_aligned"])] == ["tiny", "tiny_aligned"]
    for bad, says in [("task.level", "give KEY=v1,v2"), ("task.level=easy,,hard", "give KEY=v1,v2"),
                      ("task.level=easy,easy", "listed twice")]:
        with pytest.raises(SweepError, match=says):
            across_contexts([bad])
    with pytest.raises(SweepError, match="given twice"):
        across_contexts(["task.level=easy,hard", "task.level=medium,hard"])


def test_every_variant_and_contrast_is_repeated_in_every_context():
    matrix = build_matrix("leave-one-out", ["no_std", "token_mean"], FAMILIES)
    contexts = [Context("easy", ("task.level=easy",)), Context("hard", ("task.level=hard",))]
    check_contexts(contexts, matrix, FAMILIES)
    m = with_contexts(matrix, contexts)
    assert [v.name for v in m.variants] == ["all@easy", "drop-no_std@easy", "drop-token_mean@easy",
                                            "all@hard", "drop-no_std@hard", "drop-token_mean@hard"]
    assert m.variants[4].overrides == ("task.level=hard", "+trick=[token_mean]")
    assert m.variants[4].reference == "all@hard" and m.variants[4].context == "hard"
    assert [(c.trick, c.with_, c.without, c.tested) for c in m.contrasts][:2] == [
        ("no_std@easy", "all@easy", "drop-no_std@easy", "no_std"),
        ("no_std@hard", "all@hard", "drop-no_std@hard", "no_std")]
    assert m.contrasts[0].to_json() == {"trick": "no_std@easy", "with": "all@easy", "without": "drop-no_std@easy",
                                        "context": "easy", "tests": "no_std"}


def test_a_variants_file_may_run_a_variant_in_some_contexts_only():
    matrix = variants_matrix({"grpo": [], "batch": {"overrides": ["adv=batch"], "contexts": ["r01", "r11"]},
                              "no-std": {"overrides": ["adv=dr_grpo"], "contexts": ["easy"]}})
    contexts = file_contexts({"r01": ["reward.wrong=0"], "r11": ["reward.wrong=-1"], "easy": ["task.level=easy"]})
    m = with_contexts(matrix, contexts)
    assert [v.name for v in m.variants] == ["grpo@r01", "batch@r01", "grpo@r11", "batch@r11", "grpo@easy",
                                            "no-std@easy"]
    assert [c.trick for c in m.contrasts] == ["batch@r01", "batch@r11", "no-std@easy"]
    with pytest.raises(SweepError, match="context hard is not one of this sweep's"):
        with_contexts(variants_matrix({"grpo": [], "b": {"overrides": ["adv=batch"], "contexts": ["hard"]}}),
                      contexts)
    with pytest.raises(SweepError, match="where its reference grpo does not"):
        with_contexts(variants_matrix({"grpo": {"overrides": [], "contexts": ["r01"]},
                                       "b": {"overrides": ["adv=batch"], "contexts": ["r11"]}}), contexts)


@pytest.mark.parametrize("contexts, says", [
    ([Context("a", ("task.level=easy",)), Context("a", ("task.level=hard",))], "context a is listed twice"),
    ([Context("a", ("task.level=easy",))], "at least two"),
    ([Context("a b", ()), Context("c", ())], "context name 'a b' is not allowed"),
    ([Context("a", ("seed=3",)), Context("b", ())], "sets seed, which the sweep sets"),
    ([Context("a", ("+trick=[kl_adaptive]",)), Context("b", ())], "which the sweep sets"),
    ([Context("a", ("adv.eps=0.1",)), Context("b", ())], "changes adv, which variant all changes"),
    ([Context("a", ("loss_agg=token_sum",)), Context("b", ())], "changes loss_agg"),
    ([Context("a", ("task.level=hard",)), Context("b", ())], "which 'task.level=medium' sets for every run"),
])
def test_bad_contexts_are_refused_with_what_is_allowed(contexts, says):
    with pytest.raises(SweepError, match=says):
        check_contexts(contexts, build_matrix("leave-one-out", ["no_std", "token_mean"], FAMILIES), FAMILIES,
                       common=["preset=grpo", "task.level=medium"])


def test_file_contexts_take_a_list_or_a_mapping():
    expected = [Context("hard", ("task.level=hard",))]
    assert file_contexts([{"name": "hard", "overrides": ["task.level=hard"]}]) == expected
    for bad in ["hard", [{"overrides": []}], [{"name": "a", "overrides": "task.level=hard"}]]:
        with pytest.raises(SweepError):
            file_contexts(bad)


# ------------------------------------------------------------------------------ transfer verdicts
def cell(context, diffs, verdict=None):
    """A trick in one context from its per-seed paired Δs (the verdict: the fixed 95% rule)."""
    with_ = {s: 0.7 + d for s, d in enumerate(diffs)}
    without = {s: 0.7 for s in range(len(diffs))}
    delta = delta_ci(with_, without)
    return Cell(context, verdict or decide_by_delta(delta, True)[0], delta, list(diffs))


def one(cells):
    return transfer_verdicts({"t": cells})[0]


def test_the_same_decided_direction_everywhere_holds():
    t = one([cell("a", [0.10, 0.12, 0.11, 0.09]), cell("b", [0.11, 0.10, 0.13, 0.12])])
    assert [c["verdict"] for c in t["cells"]] == [HELPS, HELPS]
    assert t["transfer"] == HOLDS and "*helps* in every context (2)" in t["why"]


def test_a_decided_difference_is_context_dependent_and_says_where():
    t = one([cell("easy", [0.15, 0.16, 0.14, 0.15]), cell("hard", [0.01, -0.02, 0.00, 0.02])])
    assert [c["verdict"] for c in t["cells"]] == [HELPS, NO_EVIDENCE]
    assert t["transfer"] == CONTEXT_DEPENDENT
    assert "*helps* in easy; *no evidence* in hard" in t["why"] and "easy − hard = +0.14" in t["why"]


def test_opposite_decided_directions_with_a_decided_difference_flip_the_sign():
    t = one([cell("base", [0.10, 0.12, 0.11]), cell("aligned", [-0.10, -0.12, -0.09])])
    assert [c["verdict"] for c in t["cells"]] == [HELPS, HURTS]
    assert t["transfer"] == SIGN_FLIPS


def test_nothing_decided_is_undecided_with_the_seeds_that_would_decide_it():
    t = one([cell("a", [0.05, -0.03, 0.08]), cell("b", [0.00, 0.04, -0.06])])
    assert t["transfer"] == UNDECIDED and "no difference between contexts decided" in t["why"]
    assert "seeds per context" in t["to_decide"]


def test_inert_in_one_context_and_an_effect_in_another_differ_without_a_test():
    t = one([cell("single", [0.0, 0.0, 0.0], verdict=INERT), cell("multi", [0.10, 0.12, 0.11])])
    assert t["transfer"] == CONTEXT_DEPENDENT and t["pairs"][0]["how"] == "certain"


def test_holm_controls_the_whole_grid():
    assert holm([0.01, 0.04, 0.03]) == [True, False, False]     # 0.01 <= 0.05/3; 0.03 > 0.05/2
    assert holm([0.01, 0.02, 0.03]) == [True, True, True]
    assert welch_p([0.1, 0.1], [0.0, 0.0]) is None              # no spread: no test
    from scipy import stats    # the reference: scipy's Welch test

    a, b = [0.1, 0.2, 0.15], [0.0, 0.05, -0.05]
    assert welch_p(a, b) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-12)


def simulate(rng, effects, sds, interaction=0.0, seeds=5):
    """One synthetic sweep: per trick its (equal, unless `interaction`) effect in every context,
    per context its own noise; each cell decided by the report's fixed rule."""
    cells = {}
    for t, effect in enumerate(effects):
        row = []
        for k, sd in enumerate(sds):
            without = 0.7 + 0.05 * rng.standard_normal(seeds)
            with_ = without + effect + (interaction if k == 0 else 0.0) + sd * rng.standard_normal(seeds)
            row.append(cell(f"c{k}", list(with_ - without)))
        cells[f"t{t}"] = row
    return transfer_verdicts(cells, plan=False)


def test_equal_effects_everywhere_are_called_context_dependent_in_at_most_5_percent_of_sweeps():
    """The issue's check: 1,200 synthetic sweeps (3 tricks x 3 contexts x 5 seeds, effects 0,
    0.03 and 0.1 the same in every context, noise SDs 0.02 / 0.04 / 0.06 per context)."""
    rng = np.random.default_rng(20261201)
    false = 0
    sweeps = 1200
    for _ in range(sweeps):
        verdicts = simulate(rng, effects=(0.0, 0.03, 0.1), sds=(0.02, 0.04, 0.06))
        false += any(v["transfer"] in (CONTEXT_DEPENDENT, SIGN_FLIPS) for v in verdicts)
    assert false / sweeps <= 0.05, false / sweeps
    # and the test has power: a real difference of 0.1 between contexts is found most of the time
    found = sum(simulate(rng, effects=(0.0,), sds=(0.03, 0.03), interaction=0.1)[0]["transfer"]
                in (CONTEXT_DEPENDENT, SIGN_FLIPS) for _ in range(200))
    assert found / 200 > 0.8, found / 200


# ------------------------------------------------------------------------------ claims
def test_a_claim_is_judged_only_in_the_context_it_was_made_in():
    assert judge("helps", HELPS) == AGREES and judge("helps", HURTS) == CONTRADICTS
    assert judge("does not help", HURTS) == AGREES and judge("does not help", HELPS) == CONTRADICTS
    assert judge("helps", NO_EVIDENCE) == UNDECIDED_HERE and judge("helps", INERT) == NOT_TESTED
    assert context_tags({"model": {"stage": "aligned"}, "task": {"level": "hard"},
                         "reward": {"wrong": -1.0, "correct": 1.0}}) == {"model": "aligned", "data": "hard",
                                                                         "reward": "-1/1"}
    # a claim about the ceiling is judged by the fits' ceiling verdict
    assert judge("helps", RAISES, "ceiling") == AGREES and judge("no effect", RAISES, "ceiling") == CONTRADICTS
    assert judge("no effect", SAME_CEILING, "ceiling") == AGREES and judge("helps", None, "ceiling") == UNDECIDED_HERE


def test_a_sweep_in_one_context_sets_its_claims_beside_the_contrasts_that_measured_them(tmp_path):
    # a variants file sets families, not named tricks: clip=gpg against the default clip measures gpg_loss
    # (RGRA's claim: does not hurt), clip=cispo_trl measures cispo_trl (ScaleRL's: a higher ceiling)
    finals = {"grpo": [0.80, 0.82, 0.81, 0.83], "rgra": [0.90, 0.91, 0.93, 0.92], "cispo": [0.80, 0.83, 0.80, 0.84]}
    variants = {name: {"tricks": [], "reference": None if name == "grpo" else "grpo", "final": dict(enumerate(vals))}
                for name, vals in finals.items()}
    contrasts = [{"trick": v, "with": v, "without": "grpo"} for v in ("rgra", "cispo")]
    path = make_sweep(tmp_path / "claims", variants, seeds=(0, 1, 2, 3), contrasts=contrasts, mode="variants")
    clip = {"grpo": "symmetric", "rgra": "gpg", "cispo": "cispo_trl"}
    for run in path.glob("*-s*"):
        config = yaml.safe_load((run / "config.yaml").read_text())
        config.update(clip={"name": clip[run.name.split("-s")[0]]}, adv={"name": "grpo"})
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    report = build_report(path)
    rows = {(r["contrast"], r["measure"]): r for r in report.claims}
    rgra = rows[("rgra", "level")]
    assert (rgra["trick"], rgra["effect"], rgra["measured"], rgra["judged"]) == ("gpg_loss", "does not hurt", HELPS,
                                                                               AGREES)
    cispo = rows[("cispo", "ceiling")]
    assert cispo["trick"] == "cispo_trl" and cispo["effect"] == "helps"
    split = next(c for c in report.fits["contrasts"] if c["trick"] == "cispo")
    assert cispo["measured"] == (split["ceiling"] or split["split"])   # without a ceiling verdict, the split's why
    assert cispo["judged"] == judge("helps", split["ceiling"], "ceiling")
    text = render_markdown(report)
    assert "## The papers' claims beside the measurements" in text and "| rgra | gpg_loss | *does not hurt*" in text
    # a contrast whose two sides differ in more than one family names no trick, and so no claim
    for run in path.glob("rgra-s*"):
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["adv"] = {"name": "lite"}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert ("rgra", "level") not in {(r["contrast"], r["measure"]) for r in build_report(path).claims}


def context_sweep(tmp_path):
    """A synthetic leave-one-out of no_std and clip_higher in a base-like and an aligned-like
    context: no_std hurts in both, clip_higher helps on aligned and hurts on base."""
    finals = {
        "base": {"all": [0.80, 0.84, 0.82, 0.81], "drop-no_std": [0.90, 0.93, 0.91, 0.92],
                 "drop-clip_higher": [0.90, 0.95, 0.92, 0.90]},
        "aligned": {"all": [0.90, 0.91, 0.93, 0.92], "drop-no_std": [0.97, 0.99, 0.98, 0.99],
                    "drop-clip_higher": [0.80, 0.82, 0.84, 0.81]},
    }
    tricks = {"all": ["no_std", "clip_higher"], "drop-no_std": ["clip_higher"], "drop-clip_higher": ["no_std"]}
    variants = {f"{v}@{ctx}": {"tricks": tricks[v], "reference": None if v == "all" else f"all@{ctx}",
                               "final": dict(enumerate(vals))}
                for ctx, by in finals.items() for v, vals in by.items()}
    contrasts = [{"trick": f"{t}@{ctx}", "with": f"all@{ctx}", "without": f"drop-{t}@{ctx}", "context": ctx,
                  "tests": t} for t in ("no_std", "clip_higher") for ctx in finals]
    path = make_sweep(tmp_path / "ctx", variants, seeds=(0, 1, 2, 3), contrasts=contrasts)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["contexts"] = [{"name": "base", "overrides": ["model=tiny"]},
                            {"name": "aligned", "overrides": ["model=tiny_aligned"]}]
    for v in manifest["variants"]:
        v["context"] = v["name"].split("@")[1]
    (path / "manifest.json").write_text(json.dumps(manifest))
    for run in path.glob("*@*-s*"):
        config = yaml.safe_load((run / "config.yaml").read_text())
        stage = run.name.split("@")[1].split("-s")[0]
        config.update(model={"stage": stage}, task={"level": "easy"}, reward={"wrong": 0.0, "correct": 1.0})
        config["tricks"] = {t: {"family": FAMILIES[t], "option": t} for t in config["tricks"]}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def test_the_report_reads_across_contexts(tmp_path):
    report = build_report(context_sweep(tmp_path))
    t = {x["trick"]: x for x in report.transfer["tricks"]}
    assert t["no_std"]["transfer"] == HOLDS and t["clip_higher"]["transfer"] == SIGN_FLIPS
    assert report.transfer["tests"] == 2
    claims = {(r["trick"], r["where"], r["source"][:4]): r["contexts"] for r in report.transfer["claims"]}
    assert claims[("clip_higher", "model=aligned", "Tric")] == {"base": NOT_TESTED, "aligned": AGREES}
    assert claims[("clip_higher", "model=base", "Tric")] == {"base": AGREES, "aligned": NOT_TESTED}  # does not help
    assert claims[("clip_higher", "model=base", "DAPO")] == {"base": CONTRADICTS, "aligned": NOT_TESTED}   # helps
    assert claims[("no_std", "data=easy", "Tric")] == {"base": CONTRADICTS, "aligned": CONTRADICTS}
    text = render_markdown(report)
    assert "## Across contexts" in text and "| clip_higher | " in text and "**sign flips**" in text
    assert "### The papers' claims beside the measurements" in text


def test_a_sweep_in_one_context_has_no_transfer_section(tmp_path):
    from report_fixtures import LOO, LOO_CONTRASTS

    report = build_report(make_sweep(tmp_path / "loo", LOO, contrasts=LOO_CONTRASTS))
    assert report.transfer is None and "Across contexts" not in render_markdown(report)


# ------------------------------------------------------------------------------ through the CLI
def listing(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_dry_run_counts_the_runs_of_every_context(tmp_path, small):
    r = cli_here("sweep", "add-one-in", "--tricks", "no_std", "--across", "task.level=easy,hard",
                 "--across", "reward.wrong=0,-1", "--seeds", "2", "--dry-run", *small, cwd=tmp_path)
    assert r.exit_code == 0, r.stdout + r.stderr
    # each context has its own controls: the untrained base, the SFT and the RFT control
    assert "across 4 contexts: 40 runs, 4 contrasts" in r.stdout
    assert "  level-hard.wrong--1: 5 variants, 10 runs (task.level=hard reward.wrong=-1)" in r.stdout
    assert "control-base@level-hard.wrong--1" in r.stdout and "control-sft@level-easy.wrong-0" in r.stdout
    assert "expected wall time" in r.stdout and listing(tmp_path) == []


@pytest.mark.parametrize("args, says", [   # the other refusals: test_bad_contexts_are_refused_...
    (["--across", "task.bogus=1,2"], "task.bogus"),
    (["--across", "adv=grpo,rloo"], "changes adv, which variant add-no_std changes"),
])
def test_bad_contexts_exit_2_with_one_line_and_leave_nothing(tmp_path, small, args, says):
    r = cli_here("sweep", "add-one-in", "--tricks", "no_std", "--seeds", "2", *args, *small, cwd=tmp_path)
    assert r.exit_code == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert isinstance(r.exception, SystemExit) and listing(tmp_path) == []   # a refusal, not a crash


def test_a_sweep_file_with_two_contexts_of_one_name_is_refused(tmp_path, small):
    spec = {"mode": "add-one-in", "tricks": ["no_std"], "contexts": [{"name": "x", "overrides": ["task.level=easy"]},
                                                                     {"name": "x", "overrides": ["task.level=hard"]}]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    before = listing(tmp_path)
    r = cli_here("sweep", "file", "s.yaml", *small, cwd=tmp_path)
    assert r.exit_code == 2 and "context x is listed twice" in r.stderr and isinstance(r.exception, SystemExit)
    assert listing(tmp_path) == before


@pytest.mark.slow
def test_a_killed_sweep_across_contexts_resumes_to_the_same_results(tmp_path, small):
    """SIGKILL mid-sweep, resume: every run completes, and its metrics equal those of the same
    sweep run without interruption (timings aside)."""
    args = ["sweep", "add-one-in", "--tricks", "no_std", "--across", "reward.wrong=0,-1", "--seeds", "1",
            "--launcher", "basic", *[o for o in small if not o.startswith(("steps=", "checkpoint_every="))],
            "steps=8", "checkpoint_every=2"]
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    proc = subprocess.Popen([sys.executable, "-m", "grpo_ablate.cli", *args, "--dir", str(killed)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, victim = time.time() + 900, None
    while time.time() < deadline and victim is None and proc.poll() is None:
        time.sleep(0.2)
        for d in killed.glob("*-s*"):
            try:
                status = json.loads((d / "status.json").read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if status["state"] == "running" and status["step"] >= 4 and any(
                    (e / "status.json").exists() and "completed" in (e / "status.json").read_text()
                    for e in killed.glob("*-s*")):
                victim = d.name
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert victim is not None, "the sweep never reached a finished run and a checkpointed one"
    r = cli("sweep", "--resume", str(killed), cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli(*args, "--dir", str(whole), cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr

    def metrics(sweep):
        return {d.name: [{k: v for k, v in row.items() if not k.startswith(("time/", "perf/"))}
                         for row in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]
                for d in sweep.glob("*-s*")}
    assert sorted(metrics(killed)) == sorted(["add-no_std@wrong-0-s0", "add-no_std@wrong--1-s0", "base@wrong-0-s0",
                                       "base@wrong--1-s0", "control-base@wrong-0-s0", "control-base@wrong--1-s0",
                                       "control-sft@wrong-0-s0", "control-sft@wrong--1-s0",
                                       "control-rft@wrong-0-s0", "control-rft@wrong--1-s0"])   # each context's controls
    assert metrics(killed) == metrics(whole)
    assert os.path.exists(killed / "manifest.json")



# ------------------------------------------------------------------------------ controls in every context
def test_every_context_gets_its_own_controls(small):
    """The untrained base (an eval of the context's warm start) in every context by default, the SFT
    and RFT controls too where every run trains the embedded model; --no-controls drops them, and
    each control runs with its context's overrides."""
    from grpo_ablate.sweep.plan import SweepRequest, plan

    contexts = across_contexts(["task.level=easy,hard"])
    request = lambda **kw: SweepRequest(mode="add-one-in", tricks=["no_std"], seeds="2", overrides=small,
                                        contexts=contexts, **kw)
    m = plan(request())
    controls = [v for v in m["variants"] if v["kind"] == "control"]
    assert [(v["name"], v["context"]) for v in controls] == [
        ("control-base@level-easy", "level-easy"), ("control-sft@level-easy", "level-easy"),
        ("control-rft@level-easy", "level-easy"),
        ("control-base@level-hard", "level-hard"), ("control-sft@level-hard", "level-hard"),
        ("control-rft@level-hard", "level-hard")]
    assert m["controls"] == {"base": "control-base", "sft": "control-sft", "rft": "control-rft"}
    assert m["checks_training"] is True
    base_hard = next(r for r in m["runs"] if r["variant"] == "control-base@level-hard")
    assert {"task.level=hard", "control=base", "control.sample=false", "sweep.context=level-hard"} <= \
        set(base_hard["overrides"])
    assert all(v["kind"] != "control" for v in plan(request(controls=False))["variants"])
    assert len(plan(request(controls=True))["runs"]) == 2 * 5 * 2


def test_controls_in_a_sweep_file_with_contexts_and_with_seeds_auto(tmp_path, small):
    """A sweep file's `controls: true` with `contexts:` plans them per context; `--seeds auto`
    compares each treatment with its own context's controls only."""
    from grpo_ablate.sweep import sequential as sweep_seq

    spec = {"mode": "add-one-in", "tricks": ["no_std"], "controls": True, "seeds": 2,
            "contexts": [{"name": "r01", "overrides": ["reward.wrong=0"]},
                         {"name": "r11", "overrides": ["reward.wrong=-1"]}]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    r = cli_here("sweep", "file", "s.yaml", "--dry-run", *small, cwd=tmp_path)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "control-sft@r11" in r.stdout and "control-rft@r11" in r.stdout and "r01: 5 variants, 10 runs" in r.stdout
    m = {"controls": {"base": "control-base", "sft": "control-sft"},
         "variants": [{"name": f"{v}@{c}", "context": c, "kind": "control" if v.startswith("control") else "treatment"}
                      for c in ("r01", "r11") for v in ("base", "add-no_std", "control-base", "control-sft")],
         "contrasts": []}
    pairs = {(c["with"], c["without"]) for c in sweep_seq.contrasts_of(m) if c["kind"] == "control"}
    assert ("base@r01", "control-base@r01") in pairs and ("add-no_std@r11", "control-sft@r11") in pairs
    assert not any(a.split("@")[1] != b.split("@")[1] for a, b in pairs) and len(pairs) == 8
