"""Which server for this model: TorchServe, LitServe and Triton, each at its own best configuration of one sweep.

    .venv/bin/python benchmarks/servers.py [--model resnet50] [--users 16] [--seconds 15] [--slo 2000] [--gpus 0]
        [--kinds torchserve,litserve,triton]

One `servinglab sweep` with a `kind` axis (grid: batch 1/4/16 x 1/2 workers on each server, delay
10 ms, fp32), closed loop at `--users`, the model alone measured for the ceiling. Printed per server: its
best configuration and capacity within the p99 SLO, the p99 there, served/raw (the model alone at the
batch size that formed), and what a trial costs — the wall time of a trial, and what applying its
configuration took: TorchServe reconfigured in place through its management API, Triton through its
repository API, LitServe (no management API) restarted. Then one row per trial.
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
    model: str, users: int, seconds: float, slo_ms: float, gpus: int, kinds: list[str]
) -> dict[str, Any]:
    return {
        "apiVersion": "servinglab.dev/v1alpha1",
        "kind": "ServingSweep",
        "metadata": {"name": f"{model}-servers"},
        "spec": {
            "template": {
                "model": {"name": model},
                "server": {"gpus": gpus, "maxBatchDelayMs": 10, "warmupSeconds": 30},
                "load": {"concurrency": [users], "warmupSeconds": 5, "durationSeconds": seconds,
                         "payload": {"format": "jpeg"}},
                "slo": {"p99LatencyMs": slo_ms},
                "ceiling": {"rawSeconds": 5},
            },
            "strategy": "grid",
            "space": {"kind": {"values": kinds}, "batchSize": {"values": [1, 4, 16]},
                      "workers": {"values": [1, 2]}},
        },
    }  # fmt: skip


def label(config: dict[str, Any]) -> str:
    return f"b{config['batchSize']} d{config['maxBatchDelayMs']} w{config['workers']} {config['precision']}"


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--users", type=int, default=16, help="closed-loop concurrency")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--slo", type=float, default=2000.0, help="p99 latency SLO in ms")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--kinds", default="torchserve,litserve,triton", help="the servers compared, in order")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        document = sweep_document(args.model, args.users, args.seconds, args.slo, args.gpus, args.kinds.split(","))
        spec_file, output = Path(folder) / "servers.yaml", Path(folder) / "out"
        spec_file.write_text(yaml.safe_dump(document))
        started = time.monotonic()
        subprocess.run([SERVINGLAB, "sweep", str(spec_file), "--output", str(output)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        wall = time.monotonic() - started
        swept = json.loads((output / "sweep.json").read_text())
        records = {path.stem: json.loads(path.read_text()) for path in (output / "trials").glob("*.json")}
    trials = sorted(records.values(), key=lambda record: record["order"])
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for record in trials:
        by_kind.setdefault(record["config"]["kind"], []).append(record)
    rows = []
    for best in swept.get("bestPerKind") or []:
        kind = best["config"]["kind"]
        mine = by_kind[kind]
        winner = records[best["trial"]]["results"]
        ceiling = winner.get("ceiling") or {}
        applied = [r["readySeconds"] for r in mine[1:] if r.get("readySeconds") is not None]
        rows.append([
            kind, label(best["config"]), fmt(best["capacityRps"]), fmt(best.get("p99LatencyMs")),
            fmt(ceiling.get("servedOverRaw"), 2), fmt(mine[0].get("readySeconds")),
            fmt(statistics.median(applied) if applied else None) + (" (in place)" if mine[1].get("reconfigured")
                                                                     else " (restart)"),
            fmt(statistics.median(r["wallSeconds"] for r in mine)),
        ])  # fmt: skip
    print(f"{args.model}, {args.gpus} GPU(s), closed loop at {args.users} users, p99 <= {args.slo:g} ms, "
          f"{args.seconds:g} s per level; sweep wall {wall:.0f} s, stopped: {swept.get('stopReason')}")  # fmt: skip
    print(table(["server", "best configuration", "capacity rps", "p99 ms", "served/raw", "first start s",
                 "apply a configuration, median s", "trial wall, median s"], rows))  # fmt: skip
    detail = [
        [r["config"]["kind"], label(r["config"]), r["state"] + (f" ({r['reason']})" if r.get("reason") else ""),
         fmt(r.get("capacityRps")), fmt(r.get("p99LatencyMs")),
         fmt((r.get("results") or {}).get("results", [{}])[0].get("server", {}).get("meanBatchSize"), 2),
         fmt(r.get("readySeconds")), fmt(r.get("wallSeconds"))]
        for r in trials
    ]  # fmt: skip
    print(table(["server", "configuration", "state", "capacity rps", "p99 ms", "formed batch", "ready s", "wall s"],
                detail))  # fmt: skip


if __name__ == "__main__":
    main()
