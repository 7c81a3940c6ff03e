"""The simulated error rates of docs/controls.md (issue 36): the trick contrasts' family with the
training checks on, and the checks' own false calls and power. Usage, from the repo root:
    PYTHONPATH=$PWD python scripts/training_check_rates.py 2000
"""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import numpy as np  # noqa: E402
from training_sim import fast_checks, simulate_contexts  # noqa: E402

D = ("helps", "hurts")
rng = np.random.default_rng(360)
n = int(sys.argv[1])
tf = cf = found = tf_none = 0
for _ in range(n):
    tr, tk = fast_checks(*simulate_contexts(rng, training={"down": -1.0, "up": 1.0}))
    tf += any(v["verdict"] in D for v in tk.values())
    found += tr["down"]["verdict"] == "hurts" and tr["up"]["verdict"] == "helps"
    nt, _ = fast_checks(*simulate_contexts(rng, training={"a": 0.0, "b": 0.0}))
    cf += any(v["verdict"] in D for v in nt.values())
se = lambda p: math.sqrt(p * (1 - p) / n)
print(f"n={n}: trick contrasts any false helps/hurts {tf/n:.4f} ±{se(tf/n):.4f}; "
      f"training checks any false call (null) {cf/n:.4f} ±{se(cf/n):.4f}; both checks found (±1 logit) {found/n:.4f}")
