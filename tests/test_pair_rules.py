"""Settings that change what a trick means (grpo_ablate/config/pair_rules.py): each rule on its case and
its near misses, one line each at `train`, in a sweep's dry run, in `doctor --lint` and in the
report's notes; silent where a sweep file expects it; silent on every shipped preset."""
import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import REPO, cli, cli_here
from report_fixtures import LOO, LOO_CONTRASTS, make_sweep
from test_faults import refused
from grpo_ablate.config.compose import compose
from grpo_ablate.config.pair_rules import RULE_NAMES, holding

# each rule's case, as overrides of the defaults
CASES = {
    "sequence_ratio_by_length": ["clip=gspo", "loss_agg=token_mean", "updates=mini_batches"],
    "stale_steps_uncorrected": ["updates=mini_batches", "staleness=fixed"],
    "truncation_unreplayed": ["rollout.top_p=0.8", "rollout.sampling_replay=false",
                              "rollout_correction=token_truncate"],
    "replay_without_truncation": ["rollout.sampling_replay=false"],
}
# combinations one step away from a case, where nothing changes the trick's meaning
NEAR_MISSES = [
    ["clip=gspo", "updates=mini_batches"],                                     # GSPO's own aggregation
    ["clip=gspo", "loss_agg=token_mean", "updates=mini_batches", "loss_agg=seq_mean_token_mean"],
    ["clip=vespo", "loss_agg=token_mean", "updates=mini_batches"],             # its reference: token_mean
    ["updates=single", "staleness=fixed"],                                     # one step: nothing stacks
    ["updates=mini_batches", "staleness=fixed", "rollout_correction=token_truncate"],
    ["updates=mini_batches", "staleness=fixed", "proximal=behaviour"],         # the ratio is against mu
    ["rollout.top_p=0.8", "rollout_correction=token_truncate"],                # the replay is on
    ["rollout.top_p=0.8", "rollout.sampling_replay=false"],                    # no weight reads the sampler
    ["rollout.top_k=5", "rollout.sampling_replay=false"],
    [],
]


def names(overrides) -> list[str]:
    return [rule.name for rule, _ in holding(compose(overrides))]


def test_the_cases_cover_every_rule():
    assert sorted(CASES) == sorted(RULE_NAMES)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_holds_on_its_case_alone(rule):
    assert names(CASES[rule]) == [rule]


@pytest.mark.parametrize("overrides", NEAR_MISSES, ids=lambda o: " ".join(o) or "defaults")
def test_no_rule_holds_one_step_away(overrides):
    assert names(overrides) == []


def test_the_rules_read_the_registrys_flags_not_names():
    """Every option with the flags is caught: gmpo and luspo are sequence-ratio losses too, and
    every sampler log-prob reader counts as a correction (or as what an unreplayed kept set biases)."""
    assert names(["clip=gmpo", "loss_agg=token_sum", "updates=mini_batches"]) == ["sequence_ratio_by_length"]
    assert names(["clip=luspo", "loss_agg=prompt_mean"]) == ["sequence_ratio_by_length"]
    assert names(["rollout.min_p=0.1", "rollout.sampling_replay=false", "lr_scale=ess"]) == ["truncation_unreplayed"]
    assert names(["rollout.top_k=8", "rollout.sampling_replay=false", "staleness=fixed",
                  "proximal=behaviour"]) == ["truncation_unreplayed"]
    assert names(["updates=multi", "staleness=mixed", "off_policy_mask=sequence"]) == []


def test_a_control_run_has_no_pair():
    assert holding(compose(CASES["stale_steps_uncorrected"] + ["control=base"])) == []


@pytest.mark.parametrize("preset", sorted(p.stem for p in (REPO / "grpo_ablate" / "conf" / "preset").glob("*.yaml")))
def test_no_rule_holds_on_a_shipped_preset(preset):
    """A preset is a recipe: none means a pair (with one optimizer step per rollout or several)."""
    assert names([f"preset={preset}"]) == [] and names([f"preset={preset}", "updates=mini_batches"]) == []


def test_train_warns_once_for_each_rule_that_holds(small, tmp_path):
    """The real `train` command: one warning line for each rule, and it trains anyway."""
    for overrides, expected in ((CASES["sequence_ratio_by_length"] + ["staleness=fixed",
                                                                       "rollout.sampling_replay=false"],
                                 ["sequence_ratio_by_length", "stale_steps_uncorrected", "replay_without_truncation"]),
                                (CASES["truncation_unreplayed"], ["truncation_unreplayed"])):
        run_dir = tmp_path / expected[0]
        out = cli("train", *small, "steps=1", "eval.every=1", *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        lines = [line for line in (out.stdout + out.stderr).splitlines() if "(pair rule " in line]
        assert all(line.startswith("warning: ") for line in lines), lines
        assert sorted(line.split("(pair rule ")[1].split(";")[0] for line in lines) == sorted(expected), lines
        assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"


def write_pairs_file(path: Path, expected=None) -> Path:
    """A variants sweep whose variants hold the rules: two share one combination (one line for both)."""
    spec = {"mode": "variants", "seeds": 1, "controls": False,
            "variants": {"default": [], "gspo-token-mean": CASES["sequence_ratio_by_length"],
                         "gspo-token-mean-lr": CASES["sequence_ratio_by_length"] + ["optim.lr=1e-4"],
                         **{rule: CASES[rule] for rule in CASES if rule != "sequence_ratio_by_length"}}}
    if expected is not None:
        spec["expected_pairs"] = expected
    path.write_text(yaml.safe_dump(spec))
    return path


def rule_lines(text: str) -> dict:
    """rule name -> its warning lines."""
    found: dict = {}
    for line in text.splitlines():
        if "(pair rule " in line:
            assert line.startswith("warning: variant"), line
            found.setdefault(line.split("(pair rule ")[1].split(";")[0], []).append(line)
    return found


@pytest.mark.full
def test_a_dry_run_says_each_rule_once_naming_its_variants(tmp_path):
    path = write_pairs_file(tmp_path / "pairs.yaml")
    r = cli_here("sweep", "file", str(path), "--dry-run", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    found = rule_lines(r.stdout)
    assert sorted(found) == sorted(RULE_NAMES) and all(len(lines) == 1 for lines in found.values()), found
    assert "variants gspo-token-mean, gspo-token-mean-lr:" in found["sequence_ratio_by_length"][0]
    assert "variant stale_steps_uncorrected:" in found["stale_steps_uncorrected"][0]


@pytest.mark.full
def test_doctor_lint_lists_a_files_rules_and_exits_1(tmp_path):
    path = write_pairs_file(tmp_path / "pairs.yaml")
    r = cli_here("doctor", "--lint", str(path), cwd=tmp_path)
    assert r.exit_code == 1, r.output
    found = rule_lines(r.stdout)
    assert sorted(found) == sorted(RULE_NAMES) and all(len(lines) == 1 for lines in found.values()), found
    assert f"{path}: 4 pair rules hold in its runs" in r.stdout and list(tmp_path.iterdir()) == [path]


@pytest.mark.full
def test_a_file_that_expects_its_pairs_is_silent(tmp_path):
    path = write_pairs_file(tmp_path / "pairs.yaml", expected=list(RULE_NAMES))
    r = cli_here("doctor", "--lint", str(path), cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert rule_lines(r.stdout) == {} and "no pair rules hold" in r.stdout and "expected_pairs silences" in r.stdout
    r = cli_here("sweep", "file", str(path), "--dry-run", cwd=tmp_path)
    assert r.exit_code == 0 and rule_lines(r.stdout) == {}, r.output


def test_an_expected_pair_that_is_no_rule_is_refused(tmp_path):
    path = write_pairs_file(tmp_path / "pairs.yaml", expected=["sequence_ratio", "stale_steps_uncorrected"])
    refused(cli_here("sweep", "file", str(path), "--dry-run", cwd=tmp_path),
            "expected_pairs: sequence_ratio is not a pair rule; allowed: sequence_ratio_by_length")
    refused(cli_here("doctor", "--lint", str(path), "--tricks", "clip_higher", cwd=tmp_path), "drop --tricks")


def pair_config(path: Path, overrides: list[str]) -> None:
    """A fixture run's config.yaml with the trick families of `overrides` composed in."""
    cfg = yaml.safe_load(path.read_text())
    composed = OmegaConf.to_container(compose(overrides), resolve=True)
    path.write_text(yaml.safe_dump({**composed, **{k: v for k, v in cfg.items() if k != "rollout"},
                                    "rollout": {**composed["rollout"], **cfg["rollout"]}}))


@pytest.mark.parametrize("expected", [None, ["sequence_ratio_by_length"]])
def test_the_reports_notes_say_each_rule_from_the_runs_configs(tmp_path, expected):
    sweep_dir = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    for variant in ("all", "drop-b"):
        for seed in (0, 1, 2):
            pair_config(sweep_dir / f"{variant}-s{seed}" / "config.yaml", CASES["sequence_ratio_by_length"])
    if expected is not None:
        manifest = json.loads((sweep_dir / "manifest.json").read_text())
        (sweep_dir / "manifest.json").write_text(json.dumps({**manifest, "expected_pairs": expected}))
    from grpo_ablate.report.build import build_report
    from grpo_ablate.report.render import render_markdown

    report = build_report(sweep_dir)
    notes = [n for n in report.sweep.notes if "(pair rule " in n]
    if expected:
        assert notes == []
        return
    assert len(notes) == 1 and notes[0].startswith("variants all, drop-b: clip=gspo"), notes
    assert f"- {notes[0]}" in render_markdown(report)


@pytest.mark.full
def test_doctor_lint_plans_a_seeds_auto_file_too(tmp_path):
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump({"mode": "leave-one-out", "tricks": ["gspo", "token_mean"], "seeds": "auto",
                                    "max_seeds": 6, "overrides": ["updates=mini_batches"]}))
    r = cli_here("doctor", "--lint", str(path), cwd=tmp_path)
    assert r.exit_code == 1, r.output
    assert list(rule_lines(r.stdout)) == ["sequence_ratio_by_length"] and "variant all:" in r.stdout
