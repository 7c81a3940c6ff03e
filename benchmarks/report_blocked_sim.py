"""The blocked model's error rate and power through the report's real path: simulated leave-one-outs of
six tricks (tests/report_sim.py, `star_table`: each run's number drawn at the A/A noise floor, SD of Δ
between identical arms 0.022, on the k/500 grid) written to disk as the sweep command writes them, each
read by `build_report` (what `grpo-ablate report` runs), Holm at 5%. Every report gives two tests: its
verdicts (the blocked model, the default) and its sensitivity line (a paired t per contrast).

Scenarios (null: no trick has an effect): 3, 5 and 10 seeds; the hub (`all`) 1.5×, 2× and 3× noisier
than its leaves (3× at 3 seeds too); the arms' run-noise SDs spread 0.33–3×; Student-t run noise;
one failed run (a leaf diverges at one seed); half the arms sharing a seed shock of 2σ and 3σ; an
inert twin of the hub (a leaf equal to `all` at every seed: its own contrast is left out of the count,
and must get no test); accuracies near the ceiling (0.97, binomial counts of 500). Power: one true
effect among six, +0.03 and +0.05, five seeds, equal variances, beside the oracle (Dunnett's step-down
with the true variance). Each line is one JSON object, each rate with its Monte-Carlo SE;
docs/statistics.md quotes them. tests/test_report_blocked.py runs the same function: a sample through
the report's functions in the fast tier, the full count through the real path in the slow tier.

    .venv/bin/python benchmarks/report_blocked_sim.py [--sweeps 1000] [--only NAME] [--path functions]
    .venv/bin/python benchmarks/report_blocked_sim.py --ablation [--sweeps 4000]   # each rule's price
    .venv/bin/python benchmarks/report_blocked_sim.py --detectable [--sweeps 1000]  # the Power section's |Δ|

`--path functions` decides through the report's functions on the same tables (`table_verdicts`, checked
to agree with the real path), 50× faster; `--ablation` measures, that way, what each of the model's
rules (stats/blocked.py, `Rules`) costs in power and buys in error rate, one rule off at a time.
"""
import argparse
import json
import math
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy import special

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from report_sim import SD_DELTA, star_table, table_verdicts, write_table_sweep  # noqa: E402

from grpo_ablate.stats import blocked  # noqa: E402

DECIDED = ("helps", "hurts")
TRICKS = 6
HUB = [1.0] * TRICKS
SCENARIOS = {
    "null, 3 seeds": {"seeds": 3},
    "null, 5 seeds": {},
    "null, 10 seeds": {"seeds": 10},
    "hub 1.5x noisier": {"scale": [1.5] + HUB},
    "hub 2x noisier": {"scale": [2.0] + HUB},
    "hub 3x noisier": {"scale": [3.0] + HUB},
    "hub 3x noisier, 3 seeds": {"seeds": 3, "scale": [3.0] + HUB},
    "SDs spread 0.33-3x": "spread",
    "t3 run noise": {"noise": "t3"},
    "one failed run": "failed",
    "shared seed shock 2 sigma": {"shock": 2.0},
    "shared seed shock 3 sigma": {"shock": 3.0},
    "inert twin of the hub": {"twin": True},
    "near the ceiling (k/500)": {"ceiling": True},
}
POWER = {"power +0.03": 0.03, "power +0.05": 0.05}


def share(hits: int, n: int) -> dict:
    p = hits / n
    return {"rate": round(p, 4), "mc_se": round(math.sqrt(max(p * (1 - p), 1e-12) / n), 4), "n": n}


def draw(rng, name: str) -> tuple[np.ndarray, set]:
    """One sweep's table and its failed runs (row, seed) for a scenario or a power measurement."""
    if name in POWER:
        return star_table(rng, effects={0: POWER[name]}), set()
    options = SCENARIOS[name]
    if options == "spread":
        return star_table(rng, scale=rng.permutation(np.geomspace(1 / 3, 3, TRICKS + 1))), set()
    if options == "failed":
        y = star_table(rng)
        return y, {(1, int(rng.integers(y.shape[1])))}
    return star_table(rng, **options), set()


def decide(y: np.ndarray, failed: set, path: str, root: Path, i: int, power: bool = True) -> tuple[dict, dict, dict]:
    """(blocked verdicts, paired verdicts, facts) of one sweep: trick -> verdict, and what the model did
    (`power` False, through the functions: without the Power section's numbers, 5× faster)."""
    if path == "functions":
        found = table_verdicts(y, missing=failed, power=power)
        paired = {t: v["verdict"] for t, v in table_verdicts(y, test="paired", missing=failed, power=False).items()}
        model, deltas = next(iter(found.values()))["family"]["model"], {t: v["delta"] for t, v in found.items()}
        verdicts = {t: v["verdict"] for t, v in found.items()}
        power = found["t0"]["power"]
        priced = any(v["power"].get("reason") and v["power"].get("look") is None for v in found.values())
    else:
        from grpo_ablate.report.build import build_report

        sweep = write_table_sweep(root / f"s{i}", y, broken=failed)
        report = build_report(sweep)
        shutil.rmtree(sweep)
        verdicts = {v["trick"]: v["verdict"] for v in report.verdicts}
        paired = {t: v["verdict"] for t, v in report.sensitivity["verdicts"].items()}
        model, deltas = report.verdicts[0]["family"]["model"], {v["trick"]: v["delta"] for v in report.verdicts}
        power = report.verdicts[0]["power"]
        priced = bool(report.power.get("priced") or report.power.get("unpriced"))
    facts = {"clipped": "came out ≤ 0" in model and "star tested paired" in model,
             "shock": "shared seed shock" in model, "alike": "variances alike" in model,
             "twin_tested": deltas[f"t{TRICKS - 1}"].p is not None, "detectable": power.get("detectable_effect"),
             "priced": priced}
    return verdicts, paired, facts


def oracle_calls(y: np.ndarray, scale=None, alpha: float = 0.05) -> list[bool]:
    """Dunnett's step-down (Dunnett & Tamhane 1991) with the true variance σ² = SD_DELTA²/2 of every arm:
    the largest |z| against the critical value of the max of the remaining contrasts' |z|, which share
    the hub (correlation σ_h²/√((σ_h² + σ_i²)(σ_h² + σ_j²)), a one-factor structure: one integral)."""
    sigma2 = SD_DELTA ** 2 / 2 * (np.ones(len(y)) if scale is None else np.asarray(scale) ** 2)
    s = y.shape[1]
    z = np.abs((y[0] - y[1:]).mean(axis=1) / np.sqrt((sigma2[0] + sigma2[1:]) / s))
    lam = np.sqrt(sigma2[0] / (sigma2[0] + sigma2[1:]))
    calls = [False] * len(z)
    for k, i in enumerate(np.argsort(-z)):
        rest = np.argsort(-z)[k:]
        if max_abs_tail(z[i], lam[rest]) >= alpha:
            break
        calls[i] = True
    return calls


_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(80)


def max_abs_tail(c: float, lam: np.ndarray) -> float:
    """P(max_i |Z_i| ≥ c) for standard normals Z_i = λ_i W + √(1 − λ_i²) E_i (W, E_i independent):
    Gauss–Hermite over W (checked against scipy's multivariate normal in tests/test_report_blocked.py)."""
    rest = np.sqrt(1 - lam ** 2)
    w = _NODES[:, None]
    inside = special.ndtr((c - lam * w) / rest) - special.ndtr((-c - lam * w) / rest)
    return float(1 - (_WEIGHTS / _WEIGHTS.sum() * inside.prod(axis=1)).sum())


def run(name: str, sweeps: int, path: str = "report", power: bool = True) -> dict:
    """One scenario (or power measurement): the share of reports naming any false *helps* / *hurts*
    under the blocked model and the paired t, with their Monte-Carlo SEs; for power, the share that
    call the true effect *helps*, the oracle's beside it."""
    rng = np.random.default_rng(1000 + list({**SCENARIOS, **POWER}).index(name))
    effect = name in POWER
    twin = SCENARIOS.get(name) == {"twin": True}
    counts = {"blocked": 0, "paired": 0, "oracle": 0}
    found = {"blocked": 0, "paired": 0, "oracle": 0}
    facts = {"clipped": 0, "clipped_false": 0, "shock": 0, "alike": 0, "twin_tested": 0, "priced": 0}
    root = Path(tempfile.mkdtemp(prefix="blocked-sim-"))
    try:
        for i in range(sweeps):
            y, failed = draw(rng, name)
            verdicts, paired, fact = decide(y, failed, path, root, i, power)
            tests = {"blocked": verdicts, "paired": paired}
            if effect:
                tests["oracle"] = {f"t{j}": "helps" if c else "no evidence" for j, c in enumerate(oracle_calls(y))}
            for test, v in tests.items():
                counts[test] += any(x in DECIDED for t, x in v.items()
                                    if not (effect and t == "t0") and not (twin and t == f"t{TRICKS - 1}"))
                found[test] += effect and v["t0"] == "helps"
            false = any(x in DECIDED for x in verdicts.values())
            facts["clipped"] += fact["clipped"]
            facts["clipped_false"] += fact["clipped"] and false
            facts["shock"] += fact["shock"]
            facts["alike"] += fact["alike"]
            facts["twin_tested"] += fact["twin_tested"]
            facts["priced"] += fact["priced"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = {"scenario": name, "path": path, "false_report": {t: share(counts[t], sweeps) for t in ("blocked", "paired")},
           "hub_clipped": share(facts["clipped"], sweeps), "shock_found": share(facts["shock"], sweeps),
           "labelled_alike": share(facts["alike"], sweeps), "priced_a_contrast": share(facts["priced"], sweeps)}
    if facts["clipped"]:
        out["false_when_hub_clipped"] = share(facts["clipped_false"], facts["clipped"])
    if twin:
        out["twin_contrast_tested"] = facts["twin_tested"]
    if effect:
        out.update({"effect": POWER[name], "power": {t: share(found[t], sweeps) for t in found},
                    "false_report": {t: share(counts[t], sweeps) for t in counts}})
    return out


def detectable(sweeps: int, path: str = "report") -> dict:
    """Is the Power section's detectable |Δ| detected 80% of the time by the report's own test? Pairs of
    sweeps: a null one's report prints t0's detectable |Δ| (open, so at Holm's first level); a fresh sweep
    with that true effect on t0 is reported, and t0 called *helps* or not."""
    rng = np.random.default_rng(999)
    root = Path(tempfile.mkdtemp(prefix="blocked-sim-"))
    found = tried = 0
    sizes = []
    try:
        for i in range(sweeps):
            _, _, fact = decide(star_table(rng), set(), path, root, 2 * i)
            size = fact["detectable"]
            if size is None:
                continue
            verdicts, _, _ = decide(star_table(rng, effects={0: size}), set(), path, root, 2 * i + 1)
            tried += 1
            found += verdicts["t0"] == "helps"
            sizes.append(size)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"measure": "the Power section's detectable |delta| (t0, open), then a sweep with that effect",
            "path": path, "detected": share(found, tried), "median_detectable": round(float(np.median(sizes)), 4),
            "pairs_without_a_number": sweeps - tried}


ABLATION = {
    "the model": {},
    "without the shock check": {"shock_test_level": 0.0},
    "a clipped hub gets the prior (not paired)": {"hub_clip_paired": False},
    "Shukla's estimates at S - 1 df": {"effective_df": False},
    "hub never keeps its own": {"hub_test_level": 0.0},
    "hub keeps its own whenever larger": {"hub_test_level": 1.0},
    "hub test at 25%": {"hub_test_level": 0.25},
    "hub test at 10%": {"hub_test_level": 0.10},
    "twins stay in the fit": {"twins_out": False},
}
ABLATION_SCENARIOS = ["power +0.03", "null, 5 seeds", "hub 1.5x noisier", "hub 2x noisier", "hub 3x noisier",
                      "shared seed shock 3 sigma", "inert twin of the hub"]


def ablation(sweeps: int) -> None:
    """Each rule off in turn (or set otherwise), through the report's functions on the same tables."""
    default = blocked.RULES
    try:
        for label, change in ABLATION.items():
            blocked.RULES = replace(default, **change)
            row = {}
            for name in ABLATION_SCENARIOS:
                r = run(name, sweeps, "functions")
                row[name] = r["power"]["blocked"] if name in POWER else r["false_report"]["blocked"]
            print(json.dumps({"rules": label, **row}), flush=True)
    finally:
        blocked.RULES = default


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweeps", type=int, default=1000)
    parser.add_argument("--only", default=None, help="one scenario's name (or 'power +0.03', 'power +0.05')")
    parser.add_argument("--path", choices=("report", "functions"), default="report")
    parser.add_argument("--ablation", action="store_true")
    parser.add_argument("--detectable", action="store_true", help="check the Power section's detectable |delta|")
    args = parser.parse_args()
    if args.ablation:
        ablation(args.sweeps)
        return
    if args.detectable:
        print(json.dumps(detectable(args.sweeps, args.path)), flush=True)
        return
    for name in [*SCENARIOS, *POWER]:
        if args.only in (None, name):
            print(json.dumps(run(name, args.sweeps, args.path)), flush=True)


if __name__ == "__main__":
    main()
