"""What a sweep costs: trials used by the search against the grid, and the overhead per trial.

    .venv/bin/python benchmarks/sweep_cost.py [--seconds 3]

Both parts run `servinglab sweep` with the tiny model on this machine (closed loop, 16 users, one
level of `--seconds` after a 1 s warm-up, ceiling off so only serving is timed):

1. **search vs grid** on a 4-axis space (batch 1/4/16 x delay 1/10 ms x 1/2 workers x fp32/bf16,
   24 configurations, p99 <= 250 ms): trials used, best configuration and capacity found, wall time;
   the search's choice is also looked up in the grid's own measurements (same run, same noise);
2. **cost per trial** on a batch x delay grid (3 x 3), the template's ceiling on (`rawSeconds` 2):
   the trial's wall time minus its warm-up and measured seconds, and the whole wall time, three ways —
   `servinglab sweep` reconfiguring one TorchServe; `servinglab sweep --fresh-servers` (a new
   TorchServe per trial, same process and ceiling cache); and by hand, one `servinglab run` per
   configuration (what a user does without a sweep: a new process, server and ceiling each time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from common import SERVINGLAB, table


def sweep_document(
    name: str, seconds: float, strategy: str, space: dict[str, Any], ceiling: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "servinglab.dev/v1alpha1",
        "kind": "ServingSweep",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "model": {"name": "tiny"},
                "server": {"gpus": 0},
                "load": {
                    "concurrency": [16],
                    "warmupSeconds": 1,
                    "durationSeconds": seconds,
                    "payload": {"format": "jpeg"},
                },
                "slo": {"p99LatencyMs": 250},
                "ceiling": ceiling or {"enabled": False},
            },
            "strategy": strategy,
            "space": space,
            "stop": {"patience": 6},
        },
    }


def run(document: dict[str, Any], folder: Path, *extra: str) -> tuple[dict[str, Any], float]:
    spec_file, output = folder / f"{document['metadata']['name']}.yaml", folder / document["metadata"]["name"]
    spec_file.write_text(yaml.safe_dump(document))
    started = time.monotonic()
    subprocess.run([SERVINGLAB, "sweep", str(spec_file), "--output", str(output), *extra], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return json.loads((output / "sweep.json").read_text()), time.monotonic() - started


def label(config: dict[str, Any]) -> str:
    return f"b{config['batchSize']} d{config['maxBatchDelayMs']} w{config['workers']} {config['precision']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    four_axes = {"batchSize": {"values": [1, 4, 16]}, "maxBatchDelayMs": {"values": [1, 10]},
                 "workers": {"values": [1, 2]}, "precision": {"values": ["fp32", "bf16"]}}  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        rows = []
        documents = {}
        for strategy in ("grid", "search"):
            document, wall = run(sweep_document(f"cost-{strategy}", args.seconds, strategy, four_axes), Path(folder))
            documents[strategy] = document
            best = document["best"]
            rows.append([strategy, f"{document['counts']['run']} / {document['gridSize']}", label(best["config"]),
                         best["capacityRps"], f"{wall:.0f}", document["stopReason"]])  # fmt: skip
        grid = {json.dumps(t["config"], sort_keys=True): t["capacityRps"] for t in documents["grid"]["trials"]}
        chosen = grid[json.dumps(documents["search"]["best"]["config"], sort_keys=True)]
        print(table(["strategy", "trials / space", "best", "capacity rps", "wall s", "stopped"], rows))
        print(f"the search's choice as the grid measured it: {chosen:.1f} rps = "
              f"{chosen / documents['grid']['best']['capacityRps']:.0%} of the grid's best\n")  # fmt: skip

        batch_delay = {"batchSize": {"values": [1, 4, 16]}, "maxBatchDelayMs": {"values": [1, 5, 20]}}
        ceiling = {"rawSeconds": 2}
        rows = []
        for mode, extra in (("sweep, one server reconfigured", ()), ("sweep --fresh-servers", ("--fresh-servers",))):
            name = "cost-fresh" if extra else "cost-reuse"
            document, wall = run(sweep_document(name, args.seconds, "grid", batch_delay, ceiling), Path(folder), *extra)
            overheads = [t["wallSeconds"] - 1 - args.seconds for t in document["trials"]]
            rows.append([mode, len(overheads), f"{statistics.median(overheads):.1f}", f"{max(overheads[1:]):.1f}",
                         f"{wall:.0f}"])  # fmt: skip
        by_hand = by_hand_runs(sweep_document("cost-hand", args.seconds, "grid", batch_delay, ceiling), Path(folder))
        overheads = [wall - 1 - args.seconds for wall in by_hand]
        rows.append(["one `servinglab run` per configuration", len(by_hand), f"{statistics.median(overheads):.1f}",
                     f"{max(overheads[1:]):.1f}", f"{sum(by_hand):.0f}"])  # fmt: skip
        print(table(["mode", "trials", "overhead/trial median s", "overhead/trial max (after the 1st) s",
                     "wall s"], rows))  # fmt: skip


def by_hand_runs(document: dict[str, Any], folder: Path) -> list[float]:
    """Each configuration of the sweep as its own experiment file and `servinglab run`: wall seconds each."""
    from servinglab.api import grid, parse_sweep, trial_name, trial_spec

    sweep = parse_sweep(document)
    walls = []
    for config in grid(sweep.spec):
        name = trial_name(sweep.metadata.name, config)
        spec = trial_spec(sweep.spec, config).model_dump(by_alias=True, mode="json", exclude_none=True)
        experiment = {"apiVersion": sweep.api_version, "kind": "ServingExperiment", "metadata": {"name": name},
                      "spec": spec}  # fmt: skip
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(experiment))
        started = time.monotonic()
        subprocess.run([SERVINGLAB, "run", str(path), "--output", str(folder / f"{name}.json")], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        walls.append(time.monotonic() - started)
    return walls


if __name__ == "__main__":
    main()
