"""model=hf: tiny random Llama, Qwen2 and GPT-2 models saved to disk and trained by path,
with and without LoRA, mixed precision, gradient checkpointing; loading errors are one line."""
import json
import re
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, cli
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.train.grpo import train

WORD_PROBLEMS = REPO / "tests" / "data" / "word_problems.jsonl"


def hf_run(path, *extra):
    """Overrides for a 2-step run of a saved model on the shipped word problems (tiny budget)."""
    return ["model=hf", f"model.path={path}", "task=jsonl", f"task.path={WORD_PROBLEMS}", "task.eval_size=2",
            "steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6",
            "logger=none", "threads=1", "eval.every=2", "checkpoint_every=2", "samples_every=2", *extra]


def run(overrides, run_dir):
    result = train(compose(overrides), run_dir, overrides)
    assert result.state == "completed", result.reason
    return read_rows(run_dir / "metrics.jsonl")


# entropy bonus: a gradient even when every reward is 0 (a random model never answers right)
MOVES = ["entropy=bonus", "entropy.coef=0.5", "optim.lr=1e-2"]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])     # qwen2's tokenizer has a chat template
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_steps_of_a_saved_model_by_path(tiny_models, tmp_path, arch, lora):
    extra = ["model.lora.r=4"] if lora else []
    if arch == "qwen2" and lora:
        extra.append("task.chat_template=none")                 # the same model, raw prompts
    rows = run(hf_run(tiny_models[arch], *MOVES, *extra), tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[1]["kl/k3"] == pytest.approx(0.0, abs=1e-6)          # pi_theta == pi_ref at the start
    assert rows[2]["kl/k3"] > 0 and rows[1]["optim/grad_norm"] > 0     # ... and it moved
    checkpoint = tmp_path / "run" / "checkpoint"
    if lora:   # only the adapters are saved and trained; the base on disk is untouched
        assert (checkpoint / "adapter_config.json").exists() and not (checkpoint / "model.safetensors").exists()
        adapters = load_file(checkpoint / "adapter_model.safetensors")
        assert adapters and all("lora_" in k for k in adapters)
    else:
        assert (checkpoint / "model.safetensors").exists()


def test_lora_reference_is_the_base_and_no_copy(tiny_models, tmp_path, monkeypatch):
    import grpo_ablate.train.grpo as trainer_module

    monkeypatch.setattr(trainer_module, "copy", SimpleNamespace(deepcopy=lambda *_: pytest.fail("model copied")))
    rows = run(hf_run(tiny_models["llama"], *MOVES, "model.lora.r=4", "kl.beta=0.1"), tmp_path / "run")
    assert rows[2]["kl/k3"] > 0


def test_lora_resume_continues_identically(tiny_models, tmp_path):
    # constant lr: a decaying schedule's horizon is the run's `steps`, so a run stopped by steps=1
    # and resumed to 2 would decay differently from one run to 2 (a kill and resume does not)
    args = hf_run(tiny_models["llama"], *MOVES, "model.lora.r=4", "checkpoint_every=1", "eval.every=1",
                  "optim.schedule=constant")
    full = run(args, tmp_path / "full")
    run(args + ["steps=1"], tmp_path / "part")
    part = run(args + ["resume=true"], tmp_path / "part")
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]
    assert strip(part) == strip(full)


def test_mixed_precision_and_gradient_checkpointing_train(tiny_models, tmp_path):
    rows = run(hf_run(tiny_models["qwen2"], *MOVES, "model.dtype=bfloat16", "model.gradient_checkpointing=true"),
               tmp_path / "run")
    assert rows[1]["optim/grad_norm"] > 0 and all(v is not None for r in rows for v in r.values())
    # the master weights stay float32
    config = json.loads((tmp_path / "run" / "checkpoint" / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) in ("float32", None)


@pytest.mark.parametrize("override, needle", [
    ("model.path=/no/such/model", "model.path='/no/such/model' does not exist"),
    ("model.path=. model.dtype=float64", "allowed: float32, bfloat16, float16"),
    ("model.path=. model.device=tpu", "model.device='tpu' is not allowed"),
    ("model.path=. model.lora.r=-1", "model.lora.r=-1 is not allowed"),
    ("model.path=. model.disable_dropout=maybe", "model.disable_dropout='maybe' is not allowed; allowed: true, false"),
])
def test_bad_model_options(override, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        validate(compose(["model=hf", *override.split()]))


def test_hub_name_offline_and_not_cached_is_one_line(tmp_path):
    out = cli("train", "model=hf", "model.path=no-such-org/no-such-model", "logger=none", cwd=tmp_path,
              env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: model.path='no-such-org/no-such-model' is not a "
                                                   "local directory and not in the Hugging Face cache"), out.stderr
    assert not any(tmp_path.iterdir())


def test_format_reward_and_prompt_limit_in_a_run(tiny_models, tmp_path, monkeypatch):
    from grpo_ablate.tasks.dataset import DatasetTask

    monkeypatch.setattr(DatasetTask, "formatted", lambda self, completion: True)   # every answer boxed
    rows = run(hf_run(tiny_models["qwen2"], "task.format_reward=0.25", "task.max_prompt_tokens=120"),
               tmp_path / "run")
    assert rows[0]["prompts/dropped"] > 0 and "prompts/dropped_eval" in rows[0]     # counted once, at step 0
    assert rows[1]["train/accuracy"] == 0.0 and rows[1]["reward/mean"] == pytest.approx(0.25)


@pytest.fixture(scope="module")
def gpt2_with_dropout(tmp_path_factory):
    """A tiny GPT-2 whose config asks for dropout everywhere (as the released GPT-2 does, 0.1)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from grpo_ablate.models import build_char_tokenizer
    from tiny_models import CHARS

    root = tmp_path_factory.mktemp("gpt2_dropout")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(CHARS) + 3, n_embd=32, n_layer=2, n_head=2, n_positions=512,
                               resid_pdrop=0.3, embd_pdrop=0.3, attn_pdrop=0.3, pad_token_id=0, bos_token_id=1,
                               eos_token_id=2)).save_pretrained(root)
    build_char_tokenizer(CHARS).save_pretrained(root)
    return root


@pytest.mark.parametrize("disable", [True, False])
def test_disable_dropout_makes_the_first_step_kl_exactly_zero(gpt2_with_dropout, tmp_path, disable):
    """pi_theta (training mode) against pi_ref (eval mode) before any update: identical weights,
    so k3 is 0 unless dropout perturbs the policy's forward (model.disable_dropout=false)."""
    rows = run(hf_run(gpt2_with_dropout, *MOVES, "kl.beta=0.1", f"model.disable_dropout={str(disable).lower()}"),
               tmp_path / "run")
    if disable:
        assert rows[1]["kl/k3"] == pytest.approx(0.0, abs=1e-6)
    else:
        assert rows[1]["kl/k3"] > 1e-3


def test_disable_dropout_zeroes_modules_and_functional_attention_dropout():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_ablate.models import disable_dropout

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, attention_dropout=0.5))
    model.lm_head = torch.nn.Sequential(torch.nn.Dropout(0.5), model.lm_head)
    assert disable_dropout(model) == 3                    # two attention layers + one nn.Dropout
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert all(m.attention_dropout == 0 for m in model.model.layers.modules() if hasattr(m, "attention_dropout"))
    model.train()
    ids = torch.tensor([[1, 4, 5, 6, 7]])
    torch.testing.assert_close(model(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)
    assert disable_dropout(model) == 0                    # idempotent
