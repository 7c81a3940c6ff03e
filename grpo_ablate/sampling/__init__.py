"""Sampling completions: prompts in, decoded and scored completions out.

    prompts.py   a problem's prompt as token ids (chat template, system prompt, length limit)
    decode.py    `generate`: B x G completions with a KV cache; the `Rollout` they make
    lean.py      LeanDecoder: the same decoding math with less per-token overhead on a CPU
    engines.py   the rollout backends (the policy itself, vLLM) and `Rollouts`, which
                 encodes, samples, decodes and scores a batch (shared across processes)
    vllm.py      the colocated vLLM engine (imported only with rollout=vllm)
"""
