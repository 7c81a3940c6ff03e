"""What a sweep's runs started from: status.json's `start` record read back, and the runs that started
from other weights than the sweep's other runs of the same model did.

A run records the digest of the weights it started from (LoRA's base included) and where it loaded them
(`start: {weights, model}`, written by train/run_log.py; models.started_from). The embedded model's warm
start follows the CPU's kernels, so runs of one sweep on machines without a shared model cache can ask
for one model and start from two: they are different experiments, never averaged (the report leaves
the odd ones out, `sweep --resume` names them). Standard library only: the report reads it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


def recorded_start(status: dict | None) -> dict | None:
    """status.json's `start` ({weights, model}), or None where it is not recorded (a run dir from before
    the record, a run not started yet) or not of that shape."""
    start = (status or {}).get("start")
    if isinstance(start, dict) and isinstance(start.get("weights"), str) and isinstance(start.get("model"), str):
        return start
    return None


@dataclass(frozen=True)
class OtherStart:
    """A run that started from other weights than most runs of its model in its sweep."""
    run: str            # the run's name (its run dir)
    model: str          # the model it asked for (models.started_from: model.path, or the cache entry)
    weights: str        # the digest of the weights it started from
    usual: str          # the weights most runs of that model started from
    usual_runs: int     # how many did
    runs: int           # runs of that model that record their start

    @property
    def why(self) -> str:
        return (f"it started from the weights {self.weights} of {self.model}, where {self.usual_runs} of the "
                f"sweep's {self.runs} runs of that model started from {self.usual} (another machine's model cache?)")


def other_starts(starts: dict[str, dict | None]) -> list[OtherStart]:
    """The runs of `starts` (run name -> its recorded start, in the sweep's order) whose weights are not
    the ones most runs of the same model started from; on a tie, the first run's are the sweep's. Runs
    that record nothing take no part."""
    by_model: dict[str, list[tuple[str, str]]] = {}
    for name, start in starts.items():
        if start is not None:
            by_model.setdefault(start["model"], []).append((name, start["weights"]))
    found = []
    for model, runs in by_model.items():
        counts = Counter(weights for _, weights in runs)
        usual = max(counts, key=lambda w: (counts[w], -[w2 for _, w2 in runs].index(w)))
        found += [OtherStart(name, model, weights, usual, counts[usual], len(runs))
                  for name, weights in runs if weights != usual]
    return found


def not_recorded(starts: dict[str, dict | None]) -> list[str]:
    """The runs that do not record their start, where others of the sweep do (none where none does)."""
    missing = [name for name, start in starts.items() if start is None]
    return missing if len(missing) < len(starts) else []


def start_notes(starts: dict[str, dict | None]) -> list[str]:
    """A report's notes on what the runs of `starts` started from: the runs that started elsewhere, named,
    and the runs that record nothing where others do (not checked)."""
    notes = []
    if others := other_starts(starts):
        notes.append(f"{len(others)} run(s) started from other weights than the sweep's other runs of their "
                     f"model: {', '.join(f'{o.run} ({o.weights})' for o in others)}; left out, never averaged "
                     "(share the model cache between machines: docs/slurm.md)")
    if missing := not_recorded(starts):
        notes.append(f"what {len(missing)} run(s) started from is not recorded (run dirs from before the record: "
                     f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): not checked")
    return notes
