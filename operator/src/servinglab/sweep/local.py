"""`servinglab sweep FILE --output DIR`: a sweep on this machine, one trial after another.

Trials share one TorchServe (:class:`servinglab.runner.ServerSlot` with reuse): after the first,
each is applied through the management API and verified against TorchServe's own report of its
settings before any load is sent; a failed trial gets a fresh server. They also share one raw-ceiling
cache, so the model alone is measured once per precision and batch size.

Each finished trial is written to `DIR/trials/<name>.json` at once (atomically), and `DIR/sweep.json`
is rewritten after every trial, so a run that dies loses at most the trial in flight; `--resume`
reads the trials back and the search, a function of its history, carries on where it stopped.
At the end the best configuration is exported to `DIR/best/`.

The caller must have imported Locust first (see :mod:`servinglab.entry`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servinglab import runner
from servinglab.rawprobe import RawCache
from servinglab.results import now_iso
from servinglab.spec import ObjectMeta, ServingExperiment
from servinglab.sweep import export, rollup
from servinglab.sweep.search import propose
from servinglab.sweepspec import ServingSweep, TrialConfig, trial_name, trial_spec


class SweepError(RuntimeError):
    """The sweep cannot run as asked (not a trial failure: those are results)."""


def trial_experiment(sweep: ServingSweep, config: TrialConfig) -> ServingExperiment:
    labels = {**sweep.metadata.labels, "servinglab.dev/sweep": sweep.metadata.name}
    return ServingExperiment(
        api_version=sweep.api_version,
        kind="ServingExperiment",
        metadata=ObjectMeta(name=trial_name(sweep.metadata.name, config), labels=labels),
        spec=trial_spec(sweep.spec, config),
    )


def _write_atomically(path: Path, document: dict[str, Any]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(partial, path)


def load_trials(output: Path) -> list[dict[str, Any]]:
    """The records of the finished trials in an output folder, in the order they ran."""
    folder = output / "trials"
    records = [json.loads(path.read_text()) for path in folder.glob("*.json")] if folder.is_dir() else []
    return sorted(records, key=lambda r: r["order"])


def run_sweep(
    sweep: ServingSweep,
    output: Path,
    resume: bool = False,
    hooks: runner.RunHooks | None = None,
    on_trial: Callable[[dict[str, Any]], None] = lambda record: None,
    fresh_servers: bool = False,
) -> dict[str, Any]:
    """Run (or resume) the sweep; return the sweep's results document (also in DIR/sweep.json).
    `fresh_servers` starts a new TorchServe for every trial (the slow way, kept for comparison)."""
    hooks = hooks or runner.RunHooks()
    entries = load_trials(output)
    if entries and not resume:
        raise SweepError(
            f"{output} already holds {len(entries)} finished trials: pass --resume to continue that sweep, "
            "or choose another --output"
        )
    if entries and entries[0]["name"] != trial_name(
        sweep.metadata.name, TrialConfig.model_validate(entries[0]["config"])
    ):
        raise SweepError(f"{output} holds trials of another sweep ({entries[0]['name']})")
    (output / "trials").mkdir(parents=True, exist_ok=True)
    previous = output / "sweep.json"
    started_at = json.loads(previous.read_text()).get("startedAt") if resume and previous.exists() else None
    started_at = started_at or now_iso()
    if entries:
        hooks.phase(f"Resuming: {len(entries)} trials already finished")
    cache = RawCache()
    stop_reason = None
    with runner.interrupts_stop_the_run():
        slot = runner.ServerSlot(sweep.metadata.name, hooks, reuse=not fresh_servers)
        try:
            while True:
                proposal = propose(sweep.spec, [rollup.outcome(e) for e in entries], [], 1)
                if not proposal.configs:
                    stop_reason = proposal.stop_reason
                    break
                config = proposal.configs[0]
                experiment = trial_experiment(sweep, config)
                hooks.phase(f"Trial {len(entries) + 1}: {experiment.metadata.name}")
                began = time.monotonic()
                try:
                    document, failure = runner.run_in(slot, experiment, cache), None
                except runner.RunError as exc:
                    document, failure = None, str(exc)
                entry = rollup.record(sweep, experiment.metadata.name, len(entries), config, document, failure)
                entry["wallSeconds"] = round(time.monotonic() - began, 3)
                _write_atomically(output / "trials" / f"{entry['name']}.json", entry)
                entries.append(entry)
                on_trial(entry)
                _write_atomically(previous, rollup.document(sweep, entries, None, started_at))
        finally:
            slot.close()
    result = rollup.document(sweep, entries, stop_reason, started_at)
    _write_atomically(previous, result)
    if result["best"] is not None:
        best = TrialConfig.model_validate(result["best"]["config"])
        export.write_best(sweep, best, output / "best")
    return result
