"""A critic's value head starts from the run's seed alone: a run is the same whether its warm start was
found in the cache or trained just now (the warm start draws from the global RNG; a cached one does not)."""
from conftest import SMALL
from grpo_ablate.config.compose import compose
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.train.grpo import train


def test_a_critic_run_is_the_same_with_its_warm_start_trained_or_cached(tmp_path):
    args = list(SMALL) + [f"model.cache_dir={tmp_path / 'cache'}", "model.warmup.steps=60", "steps=1",
                          "eval.every=1", "adv=gae"]
    rows = []
    for name in ("trained", "cached"):   # the first run warm-starts the model into the empty cache
        assert train(compose(args), tmp_path / name, args).state == "completed"
        rows.append([{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)}
                     for r in read_rows(tmp_path / name / "metrics.jsonl")])
    assert rows[0] == rows[1] and "value/loss" in rows[0][-1]
