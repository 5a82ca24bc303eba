"""`servinglab sweep FILE --output DIR`: a sweep on this machine, one trial after another.

Trials share one server (:class:`servinglab.local.runner.ServerSlot` with reuse): after the first, each
is applied in place where the server can take a new configuration (TorchServe's management API), else the
server is restarted with it from the model it has (LitServe), and verified against the server's own
report of its settings before any load is sent; a failed trial gets a fresh server, and a sweep over
servers (a `kind` axis) starts each server once. They also share one raw-ceiling cache, so the model
alone is measured once per precision and batch size.

Each finished trial is written to `DIR/trials/<name>.json` at once (atomically), and `DIR/sweep.json`
is rewritten after every trial, so a run that dies loses at most the trial in flight; `--resume`
reads the trials back and the search, a function of its history, carries on where it stopped.
When the search stops, the best few trials are measured again in alternation (:mod:`servinglab.sweep.confirm`,
each run in `DIR/confirm/<trial>-r<round>.json`), and the configuration they name is exported to `DIR/best/`.

The caller must have imported Locust first (see :mod:`servinglab.entry`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

from servinglab.api import ObjectMeta, ServingExperiment, ServingSweep, TrialConfig, trial_name, trial_spec
from servinglab.api.conditions import now
from servinglab.api.results import to_json
from servinglab.api.trials import SweepResults, TrialRecord
from servinglab.local import runner
from servinglab.measure.raw.figures import RawCache
from servinglab.sweep import confirm, export, rollup
from servinglab.sweep.search import propose


class SweepError(RuntimeError):
    """The sweep cannot run as asked (not a trial failure: those are results)."""


def trial_experiment(sweep: ServingSweep, config: TrialConfig, repeat: int = 0) -> ServingExperiment:
    labels = {**sweep.metadata.labels, "servinglab.dev/sweep": sweep.metadata.name}
    return ServingExperiment(
        api_version=sweep.api_version,
        kind="ServingExperiment",
        metadata=ObjectMeta(name=trial_name(sweep.metadata.name, config, repeat), labels=labels),
        spec=trial_spec(sweep.spec, config),
    )


def _write_atomically(path: Path, document: BaseModel) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(to_json(document), indent=2) + "\n")
    os.replace(partial, path)


def load_trials(output: Path, kind: str = "trials") -> list[TrialRecord]:
    """The records of the finished trials (or, `kind` "confirm", confirmation runs) in an output folder,
    in the order they ran."""
    folder = output / kind
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    try:
        records = [TrialRecord.model_validate_json(path.read_text()) for path in paths]
    except ValidationError as exc:
        raise SweepError(f"{folder} holds a trial file that is not a trial record: {exc.errors()[0]['msg']}") from None
    return sorted(records, key=lambda record: record.order)


@dataclass(frozen=True)
class Planned:
    """What runs next: a configuration, and for a confirmation the trial it measures again and its round."""

    config: TrialConfig
    confirms: str | None = None
    round: int = 0


def next_run(
    sweep: ServingSweep, records: list[TrialRecord], confirmations: list[TrialRecord]
) -> tuple[Planned | None, str | None]:
    """The search's next trial; once it has stopped (its reason returned), the next confirmation run."""
    proposal = propose(sweep.spec, [rollup.outcome(record, sweep.spec.objective) for record in records], [], 1)
    if proposal.configs:
        return Planned(proposal.configs[0]), None
    runs = confirm.pending(sweep.spec, records, confirmations, [], 1)
    if not runs:
        return None, proposal.stop_reason
    return Planned(runs[0].trial.config, runs[0].trial.name, runs[0].round), proposal.stop_reason


def measure_trial(slot: runner.ServerSlot, cache: RawCache, sweep: ServingSweep, experiment: ServingExperiment,
                  planned: Planned, order: int) -> TrialRecord:  # fmt: skip
    """One trial (or confirmation run) on the slot's server, as its record; a failure is a result."""
    began = time.monotonic()
    try:
        document, failure = runner.run_in(slot, experiment, cache), None
    except runner.RunError as exc:
        document, failure = None, str(exc)
    record = rollup.record(sweep, experiment.metadata.name, order, planned.config, document, failure)
    return record.model_copy(update={"wall_seconds": round(time.monotonic() - began, 3),
                                     "confirms": planned.confirms, "round": planned.round or None})  # fmt: skip


def run_sweep(
    sweep: ServingSweep,
    output: Path,
    resume: bool = False,
    hooks: runner.RunHooks | None = None,
    on_trial: Callable[[TrialRecord], None] = lambda record: None,
    fresh_servers: bool = False,
) -> SweepResults:
    """Run (or resume) the sweep; return the sweep's results (also in DIR/sweep.json).
    `fresh_servers` starts a new server for every trial (the slow way, kept for comparison)."""
    hooks = hooks or runner.RunHooks()
    records = load_trials(output)
    if records and not resume:
        raise SweepError(
            f"{output} already holds {len(records)} finished trials: pass --resume to continue that sweep, "
            "or choose another --output"
        )
    if records and records[0].name != trial_name(sweep.metadata.name, records[0].config):
        raise SweepError(f"{output} holds trials of another sweep ({records[0].name})")
    confirmations = load_trials(output, "confirm")
    for folder in ("trials", "confirm"):
        (output / folder).mkdir(parents=True, exist_ok=True)
    previous = output / "sweep.json"
    started_at = None
    if resume and previous.exists():
        started_at = SweepResults.model_validate_json(previous.read_text()).started_at
    started_at = started_at or now()
    if records:
        hooks.phase(f"Resuming: {len(records)} trials already finished")
    cache = RawCache()
    stop_reason = None
    with runner.interrupts_stop_the_run():
        slot = runner.ServerSlot(sweep.metadata.name, hooks, reuse=not fresh_servers)
        try:
            while True:
                planned, reason = next_run(sweep, records, confirmations)
                stop_reason = stop_reason or reason
                if planned is None:
                    break
                experiment = trial_experiment(sweep, planned.config, planned.round)
                if planned.confirms is None:
                    hooks.phase(f"Trial {len(records) + 1}: {experiment.metadata.name}")
                else:
                    hooks.phase(f"Confirming {planned.confirms}: round {planned.round} of {sweep.spec.confirm.rounds}")
                record = measure_trial(slot, cache, sweep, experiment, planned, len(records) + len(confirmations))
                folder = "trials" if planned.confirms is None else "confirm"
                _write_atomically(output / folder / f"{record.name}.json", record)
                (records if planned.confirms is None else confirmations).append(record)
                on_trial(record)
                _write_atomically(previous, rollup.document(sweep, records, None, started_at, confirmations))
        finally:
            slot.close()
    result = rollup.document(sweep, records, stop_reason, started_at, confirmations)
    _write_atomically(previous, result)
    if result.best is not None:
        export.write_best(sweep, result.best.config, output / "best", result.best)
    return result
