"""Which eval a report reads (`report --eval NAME`): the runs' own evals (evals.jsonl and the eval
columns of metrics.jsonl, under the protocol each run's config.yaml names), or a protocol scored
after training by `grpo-ablate eval` (evals/<name>.json and .jsonl in each run dir). With a name,
each run's eval columns and per-problem scores become that protocol's, at the steps it scored
(the start and the final checkpoint, or every kept eval step); the training columns stay. Every
number the report computes from an eval then comes from the one protocol it names.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from grpo_ablate.errors import DamagedFile, ReportError
from grpo_ablate.evals.protocol import GREEDY, EvalProtocol, parse_metric
from grpo_ablate.evals.scores import read_evals
from grpo_ablate.report.load import Run, Sweep, nested_value
from grpo_ablate.rundir.files import EVALS_DIR, read_json, read_jsonl

EVAL_PREFIX = "eval/"
EXTRA = {"length_mean": "eval/length_mean", "truncated_frac": "eval/truncated_frac"}   # a results row's own columns


@dataclass(frozen=True)
class EvalSource:
    """The protocol a report's eval numbers come from: its name, settings (its defaults filled in),
    and whether `grpo-ablate eval` scored it after training (at `steps`) or the runs did as they trained."""
    name: str
    protocol: EvalProtocol
    after_training: bool = False
    steps: tuple = ()

    def describe(self) -> str:
        """'eval `sampled`: 8 samples per problem at T=1, scored after training at steps 0 and 30'."""
        when = ""
        if self.after_training:
            shown = ", ".join(map(str, self.steps[:-1])) + (" and " if len(self.steps) > 1 else "") + str(
                self.steps[-1]) if self.steps else "no step"
            when = f", scored after training (`grpo-ablate eval`) at step{'s' * (len(self.steps) != 1)} {shown}"
        return f"eval `{self.name}`: {self.protocol.describe()}{when}"


def own_protocol(run: Run) -> EvalProtocol:
    """The protocol a run evaluated under as it trained (config.yaml's `eval`; greedy before there were others)."""
    group = nested_value(run.config, "eval")
    if not isinstance(group, dict) or "name" not in group:
        return GREEDY
    try:
        protocol = EvalProtocol.from_group(group)
    except (TypeError, ValueError):
        return GREEDY
    return protocol.resolved(parses_answers=True)   # what it logged is in metrics.jsonl: this names and describes it


def choose_eval(sweep: Sweep, name: str | None) -> EvalSource:
    """The eval a report reads: `name` (report --eval), else the one the sweep fixed before its first run
    (decides_on.eval), else the runs' own. Runs are changed in place to hold that protocol's numbers."""
    name = name or (sweep.decides_on or {}).get("eval")
    finished = [r for r in sweep.runs if r.state != "missing" and not r.damage]
    owns = {own_protocol(r) for r in finished if r.config}
    if name is None:
        own = next(iter(owns)) if len(owns) == 1 else GREEDY
        if len(owns) > 1:
            sweep.notes.append(f"the runs evaluated under {len(owns)} protocols ("
                               + "; ".join(sorted(p.name for p in owns)) + "): their numbers are compared as they are")
        return EvalSource(own.name, own)
    headers, steps = {}, set()
    for run in finished:
        found = read_results(run, name)
        if found is None:
            if run.config and own_protocol(run).name == name:
                continue   # the run evaluated under this protocol as it trained: its own evals
            no_results(sweep, run, name)
            continue
        header, rows = found
        headers[run.name] = header
        replace_evals(run, header, rows)
        steps |= set(run.evals)
    if not headers and not any(own_protocol(r).name == name for r in finished if r.config):
        raise ReportError(f"no run of {sweep.dir} has results of eval `{name}`: score them with `grpo-ablate eval "
                          f"{sweep.dir} eval=<protocol> --name {name}` (evals/{name}.jsonl in each run dir)")
    settings = {_key(h) for h in headers.values()}
    if len(settings) > 1:
        raise ReportError(f"the runs' results of eval `{name}` were made under {len(settings)} different settings "
                          f"(protocol, max_new_tokens or task; evals/{name}.json): score them again under one")
    if headers:
        header = next(iter(headers.values()))
        protocol = EvalProtocol.from_group({**header["protocol"], "name": name})
        return EvalSource(name, protocol, True, tuple(sorted(steps)))
    own = next(own_protocol(r) for r in finished if r.config and own_protocol(r).name == name)
    return EvalSource(name, own)


def _key(header: dict) -> str:
    return json.dumps({k: header.get(k) for k in ("protocol", "max_new_tokens", "task")}, sort_keys=True)


def read_results(run: Run, name: str) -> tuple[dict, list] | None:
    """(header, rows) of a run's evals/<name>.*; None when it has none, or its header is damaged (then said
    in the run's notes: the run has no numbers of this eval, as one never scored)."""
    head = run.run_dir / EVALS_DIR / f"{name}.json"
    if not head.exists():
        return None
    try:
        header = read_json(head, "results header")
    except DamagedFile as err:
        return _damaged(run, f"{EVALS_DIR}/{name}.json", err.problem)
    if not isinstance(header, dict) or not isinstance(header.get("protocol"), dict):
        return _damaged(run, f"{EVALS_DIR}/{name}.json", "is not a results header (no protocol)")
    rows, problems = read_jsonl(run.run_dir / EVALS_DIR / f"{name}.jsonl")
    run.notes += [f"{EVALS_DIR}/{name}.jsonl: {p}" for p in problems]
    return header, rows


def _damaged(run: Run, file: str, problem: str) -> None:
    run.notes.append(f"{file} {problem}: its results of this eval are not read")
    return None


def no_results(sweep: Sweep, run: Run, name: str) -> None:
    """A run without the protocol's results: it has no eval numbers in this report (said, and warned)."""
    run.evals = {}
    run.metrics = run.metrics[[c for c in run.metrics.columns if not c.startswith(EVAL_PREFIX)]]
    if run.state == "completed":
        run.notes.append(f"no results of eval `{name}` (evals/{name}.jsonl): not in this report's eval numbers; "
                         f"`grpo-ablate eval {run.run_dir} ... --name {name}` scores it")
        sweep.warnings.append(f"warning: {run.run_dir}: no results of eval `{name}`; the report goes on without "
                              "its eval numbers")


def replace_evals(run: Run, header: dict, rows: list) -> None:
    """The run's eval columns and per-problem scores become the protocol's (at the steps it scored)."""
    evals, problem = read_evals(rows)
    protocol = EvalProtocol.from_group({**header["protocol"], "name": header.get("name", "results")})
    if problem:
        run.notes.append(f"{EVALS_DIR}: {problem}: its results of this eval are not read")
        evals = {}
    run.evals = evals
    by_step = {int(r["step"]): r for r in rows if isinstance(r.get("step"), int)}
    columns = [{"step": step, **scores.summaries(protocol),
                **{column: by_step[step].get(key) for key, column in EXTRA.items()}}
               for step, scores in sorted(evals.items())]
    training = run.metrics[[c for c in run.metrics.columns if not c.startswith(EVAL_PREFIX)]]
    scored = pd.DataFrame(columns) if columns else pd.DataFrame({"step": pd.Series([], dtype="int64")})
    merged = training.merge(scored, on="step", how="outer") if len(training.columns) > 1 or len(training) else scored
    run.metrics = merged.sort_values("step").reset_index(drop=True)


def add_eval_metric(sweep: Sweep, metric: str) -> None:
    """An eval metric a run did not log as a column (pass@3 of a protocol that logged pass@2, 4, 8)
    but whose per-problem results it has: computed from them at each eval step it scored."""
    kind = parse_metric(metric)
    if kind is None:
        return
    for run in sweep.runs:
        if metric in run.metrics.columns or not run.evals:
            continue
        values = {step: scores.value(*kind) for step, scores in run.evals.items() if scores.has(*kind)}
        if values:
            run.metrics = run.metrics.assign(**{metric: run.metrics["step"].map(values).astype(float)})
