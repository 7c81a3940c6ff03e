"""The template-collapse diagnostic (RAGEN-2; diag.input_dependence_every): the metric on hand vectors in
float64, the sub-batch and its other prompts by hand, a policy built to ignore its input told apart from a
normal one, the health flag and the report's section on synthetic runs, and real runs (full tier): logged
where due, and never changing what a run trains."""
import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo_ablate.config.compose import compose
from grpo_ablate.config.identity import config_hash
from grpo_ablate.errors import ConfigError
from grpo_ablate.config.validate import validate
from grpo_ablate.report.build import build_report
from grpo_ablate.report.health import HealthThresholds, health_flags, parse_thresholds, shown_thresholds
from grpo_ablate.report.load import metrics_frame
from grpo_ablate.report.render import render_markdown, report_json
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.sampling.decode import Rollout
from grpo_ablate.train import input_dependence as dependence
from grpo_ablate.train.forward import completion_logprobs
from report_fixtures import LOO, LOO_CONTRASTS, MAX_NEW, make_sweep, metric_rows

INF = float("inf")


# ------------------------------------------------------------------------------ the math
def test_the_metric_by_hand():
    # two completions of 3 and 2 tokens (the third of the second is padding, -inf there: left out)
    own = torch.tensor([[-0.5, -1.0, -0.25], [-2.0, -0.5, -INF]], dtype=torch.float64)
    other = torch.tensor([[-1.5, -1.0, -1.25], [-1.0, -2.5, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # row 0: 1 + 0 + 1 = 2 over 3 tokens; row 1: -1 + 2 = 1 over 2 tokens
    assert dependence.input_dependence_metrics(own, other, mask) == {
        "diag/input_dependence": (2 / 3 + 1 / 2) / 2, "diag/input_dependence_seq": (2 + 1) / 2}
    # the same completion under the same prompt: exactly 0
    assert dependence.input_dependence_metrics(own, own, mask) == {"diag/input_dependence": 0.0,
                                                                   "diag/input_dependence_seq": 0.0}


def test_the_sub_batch_takes_the_groups_in_turns_and_each_row_the_next_groups_prompt():
    index = torch.tensor([0, 0, 0, 1, 1, 2])
    # turns: first of each group (rows 0, 3, 5), then second of each (1, 4), then third (2)
    assert dependence.pick_rows(index, 4).tolist() == [0, 1, 3, 5]
    assert dependence.pick_rows(index, 2).tolist() == [0, 3]
    assert dependence.pick_rows(index, None).tolist() == [0, 1, 2, 3, 4, 5]
    # groups 0, 0, 1, 2 are scored under groups 1, 1, 2 and 0 (their first rows: 3, 3, 5, 0)
    assert dependence.other_prompt_rows(index, torch.tensor([0, 1, 3, 5])).tolist() == [3, 3, 5, 0]
    assert dependence.other_prompt_rows(torch.tensor([0, 0, 0]), torch.tensor([0, 1])) is None   # one prompt


def test_a_completion_under_another_prompt_keeps_its_tokens_and_takes_the_prompt_block():
    # P = 3, left-padded prompts (pad 0): row 0 "7 8 9", row 1 "_ 5 6"; completions "1 2" and "3 _"
    roll = Rollout(torch.tensor([[7, 8, 9, 1, 2], [0, 5, 6, 3, 0]]), torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 0]]),
                   3, torch.tensor([[1, 1], [1, 0]]), torch.zeros(2, dtype=torch.bool))
    swapped = dependence.with_prompts_of(roll, torch.tensor([0, 1]), torch.tensor([1, 0]))
    assert swapped.sequences.tolist() == [[0, 5, 6, 1, 2], [7, 8, 9, 3, 0]]
    assert swapped.attention_mask.tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert swapped.completion_mask.tolist() == [[1, 1], [1, 0]] and swapped.prompt_len == 3


# ------------------------------------------------------------------------------ a policy that ignores its input
class PromptBlind(torch.nn.Module):
    """The same network reading one fixed prompt, whatever it is given: its completions depend on
    nothing of the input, and their entropy is the network's own."""

    def __init__(self, inner, prompt_len: int):
        super().__init__()
        self.inner, self.prompt_len = inner, prompt_len

    def forward(self, input_ids, **kwargs):
        ids = input_ids.clone()
        ids[:, :self.prompt_len] = 1
        return self.inner(input_ids=ids, **kwargs)


def sampled(model, prompts: torch.Tensor, new: int, seed: int) -> Rollout:
    """`new` tokens sampled after each prompt (all of one length: no padding), as a Rollout."""
    generator, sequences = torch.Generator().manual_seed(seed), prompts
    with torch.no_grad():
        for _ in range(new):
            logits = model(input_ids=sequences).logits[:, -1]
            sequences = torch.cat([sequences, torch.multinomial(logits.softmax(-1), 1, generator=generator)], dim=1)
    n = len(prompts)
    return Rollout(sequences, torch.ones_like(sequences), prompts.shape[1], torch.ones(n, new, dtype=torch.long),
                   torch.zeros(n, dtype=torch.bool))


def measured(model, roll: Rollout, group_index: torch.Tensor, rows: int | None) -> tuple[dict, float]:
    """The diagnostic as the trainer computes it, and the policy's mean entropy."""
    picked = dependence.pick_rows(group_index, rows)
    donors = dependence.other_prompt_rows(group_index, picked)
    with torch.no_grad():
        own, entropy = completion_logprobs(model, roll, remove_padding=False)
        other = completion_logprobs(model, dependence.with_prompts_of(roll, picked, donors), remove_padding=False)[0]
    return (dependence.input_dependence_metrics(own[picked], other, roll.completion_mask[picked]),
            float(entropy.mean()))


def test_a_policy_built_to_ignore_its_input_reads_zero_and_a_normal_one_does_not():
    config = Qwen2Config(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                         initializer_range=0.3, attn_implementation="eager")
    torch.manual_seed(0)
    normal = Qwen2ForCausalLM(config).double().eval()
    blind = PromptBlind(normal, prompt_len=3)
    groups, G = 4, 4
    prompts = torch.randint(2, 16, (groups, 3), generator=torch.Generator().manual_seed(1)).repeat_interleave(G, 0)
    index = torch.arange(groups).repeat_interleave(G)
    normal_metrics, normal_entropy = measured(normal, sampled(normal, prompts, 6, seed=2), index, rows=8)
    blind_metrics, blind_entropy = measured(blind, sampled(blind, prompts, 6, seed=2), index, rows=8)
    assert normal_metrics["diag/input_dependence"] > 0.5 and normal_metrics["diag/input_dependence_seq"] > 3
    assert all(abs(blind_metrics[k]) < 1e-12 for k in ("diag/input_dependence", "diag/input_dependence_seq"))
    # and entropy cannot tell them apart: the blind policy's is as high as the normal one's
    assert blind_entropy > 0.5 * normal_entropy > 0


# ------------------------------------------------------------------------------ the setting
def test_the_settings_are_checked_and_never_hashed():
    for bad, needle in [("diag.input_dependence_every=-1", "diag.input_dependence_every=-1"),
                        ("diag.input_dependence_rows=1", "diag.input_dependence_rows=1")]:
        with pytest.raises(ConfigError, match=needle):
            validate(compose([bad]))
    on = compose(["diag.input_dependence_every=3", "diag.input_dependence_rows=16"])
    assert config_hash(on) == config_hash(compose([]))


# ------------------------------------------------------------------------------ the health flag
LOGGED = (1, 10, 20, 30, 40)


def logged(values: dict):
    """A curve logged at LOGGED steps only (None, not logged, elsewhere)."""
    return lambda s: values.get(s)


def test_the_flag_fires_when_dependence_falls_while_entropy_holds():
    falling = logged({1: 2.0, 10: 1.5, 20: 0.9, 30: 0.4, 40: 0.2})
    flags = health_flags(metrics_frame(metric_rows(diag__input_dependence=falling)), [], MAX_NEW)
    assert [(f.name, f.step) for f in flags] == [("template_collapse", 20)]
    assert "diag/input_dependence 0.9 < 0.5 x its first value 2" in flags[0].detail
    assert "policy/entropy at 1.00 x its first" in flags[0].detail
    # two logged values below are not yet `patience` (3) in a row; a lower threshold is not reached
    assert health_flags(metrics_frame(metric_rows(diag__input_dependence=logged({1: 2.0, 10: 0.5, 20: 0.4,
                                                                                  30: 1.5}))), [], MAX_NEW) == []
    strict = parse_thresholds(["input_dependence_frac=0.1"])
    assert health_flags(metrics_frame(metric_rows(diag__input_dependence=falling)), [], MAX_NEW, strict) == []


def test_no_flag_without_the_metric_or_with_a_first_value_at_or_below_zero():
    assert health_flags(metrics_frame(metric_rows()), [], MAX_NEW) == []
    noisy = logged({1: -0.1, 10: -0.5, 20: -0.5, 30: -0.5, 40: -0.5})
    assert health_flags(metrics_frame(metric_rows(diag__input_dependence=noisy)), [], MAX_NEW) == []


def test_its_threshold_is_shown_only_where_a_run_logged_the_metric(tmp_path):
    class Run:
        def __init__(self, columns):
            self.metrics = metrics_frame([{"step": 1, **{c: 1.0 for c in columns}}])

    assert "input_dependence_frac" not in shown_thresholds(HealthThresholds(), [Run(["policy/entropy"])])
    assert shown_thresholds(HealthThresholds(), [Run([]), Run(["diag/input_dependence"])])[
        "input_dependence_frac"] == 0.5
    with pytest.raises(Exception, match="input_dependence_frac=2"):
        parse_thresholds(["input_dependence_frac=2"])


# ------------------------------------------------------------------------------ the report
def test_the_report_sets_dependence_beside_entropy_and_flags_the_collapsed_runs(tmp_path):
    falling = {"diag__input_dependence": logged({1: 2.0, 10: 1.5, 20: 0.9, 30: 0.4, 40: 0.2})}
    steady = {"diag__input_dependence": logged({1: 2.0, 10: 2.1, 20: 1.9, 30: 2.0, 40: 2.2})}
    variants = dict(LOO, **{"drop-c": dict(LOO["drop-c"], curves=falling), "all": dict(LOO["all"], curves=steady)})
    report = build_report(make_sweep(tmp_path / "s", variants, contrasts=LOO_CONTRASTS))
    rows = {r["variant"]: r for r in report.diagnostics["input_dependence"]}
    assert set(rows) == {"all", "drop-c"}
    assert rows["drop-c"]["first"] == 2.0 and rows["drop-c"]["last"] == pytest.approx(0.2)
    assert rows["drop-c"]["last_over_first"] == pytest.approx(0.1) and rows["drop-c"]["entropy_last_over_first"] == 1
    assert rows["drop-c"]["flagged"] == 3 and rows["all"]["flagged"] == 0
    text = render_markdown(report)
    assert "## Input dependence" in text and "| drop-c | 3 | 2.000 | 0.200 | 0.100 | 1.000 | 3 |" in text
    assert "| drop-c-s0 | template_collapse | 20 |" in text
    assert "input_dependence_frac=0.5" in text and "kl_drift and template_collapse are warnings" in text
    assert report_json(report)["thresholds"]["input_dependence_frac"] == 0.5
    # a warning: the variant whose runs collapsed is not what breaks training
    assert all("template_collapse" not in v["why"] for v in report.verdicts)


def test_a_report_without_the_metric_reads_as_before(tmp_path):
    text = render_markdown(build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)))
    assert "Input dependence" not in text and "input_dependence_frac" not in text
    assert "; kl_drift is a warning." in text


# ------------------------------------------------------------------------------ real runs
def run(overrides, run_dir):
    from grpo_ablate.train.grpo import train

    result = train(compose(overrides), run_dir, overrides)
    assert result.state == "completed", result.reason
    return read_rows(run_dir / "metrics.jsonl")


def test_logged_at_step_1_and_every_n_and_never_changing_training(small, tmp_path):
    base = small + ["steps=4"]
    off = run(base, tmp_path / "off")
    on = run(base + ["diag.input_dependence_every=3", "diag.input_dependence_rows=6"], tmp_path / "on")
    assert [r["step"] for r in on if "diag/input_dependence" in r] == [1, 3]
    diagnosed = [r for r in on if "diag/input_dependence" in r]
    # the warm-started model answers the arithmetic it is asked: its completions depend on the prompt
    assert all(r["diag/input_dependence"] > 0 and math.isfinite(r["diag/input_dependence_seq"]) for r in diagnosed)
    assert all(r["time/input_dependence_s"] > 0 for r in diagnosed)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES + ("diag/",))}
                          for r in rows]
    assert strip(on) == strip(off)
    assert not any(k.startswith("diag/") for r in off for k in r)


def test_with_a_forward_of_pi_old_it_reads_that_one(small, tmp_path):
    """updates=multi: pi_old has its own forward, which the diagnostic's own-prompt scores come from."""
    rows = run(small + ["steps=1", "updates=multi", "diag.input_dependence_every=1"], tmp_path / "run")
    assert rows[1]["diag/input_dependence"] > 0 and rows[1]["ppo/optimizer_steps"] > 1
