#!/usr/bin/env bash
# The GPU path, measured in one go on a machine with a CUDA GPU (issue 16, item 3):
#   1. the `gpu`-marked tests (bf16/fp16 autocast, flash attention where installed, real vLLM
#      rollouts with weight sync where vllm is installed);
#   2. benchmarks/gpu_throughput.py: rollout=hf vs rollout=vllm tokens/s on a Qwen2.5-0.5B-shaped
#      model built from its config (no download);
#   3. a 20-step run of the word-problem command (docs/real-models.md) on that model;
#   4. micro-batches on that model: the same step's metrics at a lower peak CUDA memory
#      (benchmarks/micro_batch_memory.py, updates.micro_batch_size none/8/4/2);
#   5. top-p sampling with the kept-set replay on and off, on each backend: rollout/ratio_mean_full
#      is the kept mass without the replay, rollout/ratio_mean_kept is 1 with it.
# Everything lands in ${OUT:-runs/gpu_check}/ (gpu_check.log, throughput.jsonl, the run dir).
# Usage: bash scripts/gpu_check.sh            (after `make install`; add vllm with pip install -e '.[vllm]')
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
out=${OUT:-runs/gpu_check}
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1
export HF_HUB_OFFLINE=1 WANDB_MODE=offline
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA GPU here')" || exit 2
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
backends=(hf); $PY -c "import vllm" 2>/dev/null && backends+=(vllm)
status=0

echo "== 1. gpu tests"
$PY -m pytest -q -m gpu tests/test_gpu.py -rs || status=1

echo "== 2. throughput (${backends[*]})"
$PY benchmarks/gpu_throughput.py --backend "${backends[@]}" --steps 5 --warmup 2 | tee "$out/throughput.jsonl" || status=1

echo "== 3. 20 steps of the word-problem command (docs/real-models.md), on the model built from its config"
model=runs/bench/qwen2.5-0.5b-random        # written by step 2
rm -rf "$out/run"
$PY -m grpo_ablate.cli train model=hf model.path="$model" model.dtype=bfloat16 rollout="${backends[-1]}" \
    task=jsonl task.path=tests/data/word_problems.jsonl task.eval_size=8 rollout.max_new_tokens=256 \
    task.chat_template=none steps=20 eval.every=20 logger=none hydra.run.dir="$out/run" || status=1
$PY - "$out/run" <<'PY' || status=1
import json, statistics, sys
rows = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl")]
steps = [r for r in rows if r.get("step", 0) >= 1 and "time/step_s" in r]
print(f"run: {len(steps)} steps, median step {statistics.median(r['time/step_s'] for r in steps):.2f} s,"
      f" final loss {steps[-1]['loss']:.4g}")
PY
echo "== 4. micro-batches: the same step, peak memory by micro_batch_size"
$PY benchmarks/micro_batch_memory.py --sizes none,8,4,2 --steps 2 \
    --base "model=hf model.path=$model model.dtype=float32 task=jsonl task.path=tests/data/word_problems.jsonl \
            task.eval_size=8 task.chat_template=none rollout.max_new_tokens=128 eval.every=20" \
    | tee "$out/micro_batches.jsonl" || status=1

echo "== 5. top-p 0.8 with the kept-set replay on and off (${backends[*]})"
for backend in "${backends[@]}"; do
  for replay in true false; do
    rm -rf "$out/top_p-$backend-$replay"
    $PY -m grpo_ablate.cli train rollout="$backend" rollout.top_p=0.8 temperature.value=1.6 \
        rollout_correction=token_truncate rollout.sampling_replay=$replay steps=3 eval.every=3 logger=none \
        hydra.run.dir="$out/top_p-$backend-$replay" > /dev/null || status=1
    $PY - "$out/top_p-$backend-$replay" "$backend" "$replay" <<'PY' || status=1
import json, statistics, sys
rows = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl") if "rollout/kept_mass" in line]
mean = lambda key: statistics.mean(r[key] for r in rows)
print(f"top_p backend={sys.argv[2]} replay={sys.argv[3]}: kept mass {mean('rollout/kept_mass'):.4f}, ratio mean "
      f"over the kept set {mean('rollout/ratio_mean_kept'):.4f}, over the vocabulary {mean('rollout/ratio_mean_full'):.4f}")
PY
  done
done
echo "gpu_check: exit $status"
exit $status
