"""Fast checks of the real-model plumbing that load no model: task=quiz, the GGUF options of
model=hf and their one-line errors (the real SmolLM2 runs are in test_smollm2.py, slow tier)."""
import re

import pytest
import torch

from conftest import cli
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.models import gguf_source, local_path
from grpo_ablate.tasks import QuizTask, build_task
from grpo_ablate.tasks.quiz import last_integer


@pytest.mark.parametrize("kind", ["add", "larger", "count"])
def test_quiz_is_deterministic_and_holds_its_eval_split_out(kind):
    task = QuizTask(kind=kind, eval_size=16)
    assert task.train_batch(4, seed=0, step=3) == QuizTask(kind=kind, eval_size=16).train_batch(4, seed=0, step=3)
    assert task.train_batch(4, seed=0, step=3) != task.train_batch(4, seed=1, step=3)
    held_out = {p.prompt for p in task.eval_set()}
    assert len(held_out) == 16 and not held_out & {p.prompt for p in task.train}
    assert all(p.prompt.endswith("Answer with the number only.") for p in task.eval_set())


@pytest.mark.parametrize("kind, held, total", [("add", 64, 100), ("count", 64, 158), ("larger", 2003, 8010)])
def test_quiz_eval_size_changes_the_eval_only(kind, held, total):
    """A fixed held-out set per kind (a quarter, at least 64: the default eval_size fits add's 100):
    training is the rest whatever eval_size is, and a smaller eval is a prefix of a larger one."""
    small, large = QuizTask(kind=kind, eval_size=8), QuizTask(kind=kind, eval_size=held)
    assert small.train == large.train and len(small.train) == total - held
    assert large.eval_set()[:8] == small.eval_set()
    for seed, step, round_ in ((0, 1, 0), (3, 7, 0), (1, 2, 2)):
        assert small.train_batch(8, seed, step, round_) == large.train_batch(8, seed, step, round_)
    drawn = {p.prompt for step in range(1, 301) for p in small.train_batch(16, seed=0, step=step)}
    assert not drawn & {p.prompt for p in large.eval_set()}
    with pytest.raises(ValueError, match=f"task.eval_size={held + 1} is more than the {held} held-out problems"):
        QuizTask(kind=kind, eval_size=held + 1)


def test_quiz_answers_are_right_and_the_reward_reads_the_last_integer():
    add = {p.prompt: p.answer for p in QuizTask(kind="add").train + QuizTask(kind="add").eval_set()}
    assert add["What is 3 + 5? Answer with the number only."] == 8 and len(add) == 100
    count = QuizTask(kind="count")
    problem = next(p for p in count.train + count.eval_set() if "'r' appear in the word 'cherry'" in p.prompt)
    assert problem.answer == 2
    task = QuizTask(kind="larger")
    problem = task.eval_set()[0]
    assert task.reward(f"Between the two numbers, {problem.answer} is larger.", problem) == 1.0
    wrong = problem.answer - 1
    assert task.reward(f"{problem.answer} vs {wrong}: the answer is {wrong}", problem) == 0.0
    assert last_integer("no number") is None and last_integer("3 + 5 = 8.") == 8


@pytest.mark.parametrize("options, needle", [
    ({"kind": "mul"}, "task.kind='mul' is not allowed; allowed: add, larger, count"),
    ({"kind": "add", "eval_size": 100}, "task.eval_size=100 is more than the 64 held-out problems of task.kind=add"),
])
def test_bad_quiz_options(options, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        QuizTask(**options)


def test_quiz_composes_as_a_task_group():
    task = build_task(compose(["task=quiz", "task.kind=count"]).task)
    assert isinstance(task, QuizTask) and task.kind == "count"


def test_gguf_sources(tmp_path):
    file = tmp_path / "m.gguf"
    file.write_bytes(b"GGUF")
    assert gguf_source(compose(["model=hf", f"model.path={file}"]).model) == file
    assert gguf_source(compose(["model=hf", f"model.path={tmp_path}", "model.gguf_file=m.gguf"]).model) == file
    assert gguf_source(compose(["model=hf", f"model.gguf_file={file}"]).model) == file    # no path needed
    assert gguf_source(compose(["model=hf", f"model.path={tmp_path}"]).model) is None   # a plain folder
    assert local_path("pkg:grpo_ablate").endswith("grpo_ablate")


@pytest.mark.parametrize("overrides, needle", [
    (["model=hf", "model.path=/no/such.gguf"], "model.path='/no/such.gguf' does not exist; give a .gguf file"),
    (["model=hf", "model.path=/tmp", "model.gguf_file=no-such.gguf"],
     "model.gguf_file='no-such.gguf' in model.path='/tmp' does not exist (looked for /tmp/no-such.gguf)"),
    (["model=hf", "model.path=pkg:no_such_package"],
     "model.path='pkg:no_such_package': the Python package 'no_such_package' is not installed"),
])
def test_bad_gguf_options_are_one_line(overrides, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        validate(compose(overrides))


def test_a_missing_gguf_file_exits_2_with_one_line(tmp_path):
    out = cli("train", "model=hf", "model.path=/no/such.gguf", "task=quiz", "logger=none", cwd=tmp_path)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == ["error: model.path='/no/such.gguf' does not exist; give a .gguf file"], out.stderr


def test_lean_decoder_names_what_it_cannot_run():
    """A run falls back to the model's own forward for these, and says why once (train/grpo.py)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from grpo_ablate.sampling.lean import supports, unsupported

    shape = dict(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1)
    assert unsupported(LlamaForCausalLM(LlamaConfig(**shape))) is None
    linear = LlamaConfig(**shape, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    assert "rope_type 'linear'" in unsupported(LlamaForCausalLM(linear))
    assert "biases" in unsupported(LlamaForCausalLM(LlamaConfig(**shape, attention_bias=True)))
    assert "model_type 'gpt2'" in unsupported(GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=16, n_layer=1,
                                                                          n_head=2)))
    assert not supports(LlamaForCausalLM(LlamaConfig(**shape, mlp_bias=True)))


def test_lean_decoder_samples_a_lora_model_as_its_own_forward():
    """LoRA adapters (B != 0) merged into LeanDecoder's snapshot: the sampled tokens' log-probs
    are the peft model's forward's, greedy decoding picks the same tokens, the model is untouched."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_ablate.sampling.decode import generate
    from grpo_ablate.sampling.lean import supports
    from grpo_ablate.train.forward import completion_logprobs

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                            init_lora_weights=False)).eval()
    assert supports(model)
    before = [p.clone() for p in model.parameters()]
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10], [11]]
    common = dict(max_new_tokens=8, eos_id=2, pad_id=0)
    roll = generate(model, prompts, num_samples=2, temperature=1.0, lean=True,
                    generator=torch.Generator().manual_seed(0), **common)
    with torch.no_grad():
        logp, _ = completion_logprobs(model, roll, remove_padding=False)
        with model.disable_adapter():   # the adapters matter here: the base model scores otherwise
            base_logp, _ = completion_logprobs(model, roll, remove_padding=False)
    mask = roll.completion_mask.bool()
    torch.testing.assert_close(roll.sampler_logprobs[mask], logp[mask], rtol=0, atol=1e-5)
    assert (roll.sampler_logprobs - base_logp)[mask].abs().max() > 1e-3
    greedy = [generate(model, prompts, num_samples=1, temperature=0.0, lean=lean, **common) for lean in (True, False)]
    assert torch.equal(greedy[0].sequences, greedy[1].sequences)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_gguf_file_into_a_cache_that_cannot_be_written_is_one_line(tmp_path):
    """The conversion is refused before the ~1 min load when its cache cannot be written (here
    GRPO_ABLATE_CACHE names a file), naming the path and the setting that moves it."""
    from grpo_ablate.models import ModelPathError, ensure_gguf_converted

    (tmp_path / "model.gguf").write_bytes(b"GGUF not a real model")
    (tmp_path / "cache").write_text("a file, not a folder")
    with pytest.raises(ModelPathError, match=r"cannot write the model cache .*cache: .*set GRPO_ABLATE_CACHE"):
        ensure_gguf_converted(tmp_path / "model.gguf", tmp_path / "cache", log=lambda *_: None)
    assert (tmp_path / "cache").read_text() == "a file, not a folder"
