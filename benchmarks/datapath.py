"""What the handler's data path options change: served throughput, the handler's preprocess and inference
time per batch, and served/raw (the model alone run as served: compiled or channels-last too).

    .venv/bin/python benchmarks/datapath.py [--seconds 20] [--paths default,threads2,float,cl,compile]
    python3 benchmarks/datapath.py --gpu [--precision fp16] [--batch 64] [--workers 2] [--users 256]
                                   [--paths default,threads8,device,pinned8,device-cro,compile-cro]

Runs `servinglab run` (local TorchServe) with ResNet-50 and JPEG requests, once per data path. On the CPU:
fp32, 1 worker, closed loop at 4 users, at batch 4 (the best configuration of this machine's sweep) and
batch 1 (docs/benchmarks.md section 3: served/raw 0.97 and 0.64 before these options). With --gpu: one
GPU at the given precision, batch, workers and users, with the CUDA paths among the choices. Each row is
what the workers reported they ran (`runtime.dataPath`), so a path that did not take effect shows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml
from common import SERVINGLAB, experiment, table

#: Named data paths (`server.dataPath` blocks) the command line picks from.
PATHS: dict[str, dict[str, Any]] = {
    "default": {},
    "threads2": {"decodeThreads": 2},
    "threads4": {"decodeThreads": 4},
    "threads8": {"decodeThreads": 8},
    "float": {"transfer": "float"},
    "float-threads2": {"transfer": "float", "decodeThreads": 2},
    "cl": {"channelsLast": True},
    "nocl": {"channelsLast": False},
    "compile": {"compile": "default"},
    "device": {"decode": "device"},
    "pinned8": {"decodeThreads": 8, "pinnedCopies": True},
    "device-cro": {"decode": "device", "compile": "reduce-overhead"},
    "compile-cro": {"decodeThreads": 8, "pinnedCopies": True, "compile": "reduce-overhead"},
}


def run(server: dict[str, Any], users: int, seconds: float) -> dict[str, Any]:
    load = {"concurrency": [users], "warmupSeconds": 5, "durationSeconds": seconds, "payload": {"format": "jpeg"}}
    document = experiment("datapath", "resnet50", server, load)
    document["spec"]["ceiling"] = {"rawSeconds": 10}
    with tempfile.TemporaryDirectory() as folder:
        spec_file, out = Path(folder) / "experiment.yaml", Path(folder) / "results.json"
        spec_file.write_text(yaml.safe_dump(document))
        subprocess.run([SERVINGLAB, "run", str(spec_file), "--output", str(out)], check=True)
        results: dict[str, Any] = json.loads(out.read_text())
    return results


def row(name: str, server: dict[str, Any], results: dict[str, Any]) -> list[Any]:
    ceiling, level = results.get("ceiling") or {}, results["results"][0]
    breakdown = level.get("server") or {}
    ran = (results.get("runtime") or {}).get("dataPath") or {}
    over_raw = ceiling.get("servedOverRaw")
    return [f"b{server['batchSize']} w{server['workers']} {server['precision']}", name, level["throughputRps"],
            level["latencyMs"]["p99"], breakdown.get("meanBatchSize", "-"), breakdown.get("preprocessMsPerBatch", "-"),
            breakdown.get("inferenceMsPerBatch", "-"), ceiling.get("rawAtFormedBatchRps", "-"),
            f"{over_raw:.3g}" if over_raw else "-", ran.get("note", "(not reported)")]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--gpu", action="store_true", help="One GPU, with the CUDA paths among the choices.")
    parser.add_argument("--paths", default=None, help=f"Comma-separated, of: {', '.join(PATHS)}.")
    parser.add_argument("--batches", default="4,1", help="CPU: the batch sizes (4 users each).")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--delay", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--users", type=int, default=256)
    args = parser.parse_args()
    names = (args.paths or ("default,threads8,device,pinned8,device-cro,compile-cro" if args.gpu
                            else "default,threads2,float,cl,compile")).split(",")  # fmt: skip
    if args.gpu:
        servers = [{"batchSize": args.batch, "maxBatchDelayMs": args.delay, "workers": args.workers,
                    "precision": args.precision, "gpus": 1}]  # fmt: skip
        users = args.users
    else:
        servers = [{"batchSize": int(b), "maxBatchDelayMs": 20, "workers": 1, "precision": "fp32"}
                   for b in args.batches.split(",")]  # fmt: skip
        users = 4
    rows = []
    for server in servers:
        for name in names:
            # a compiled model warms up every padded batch size before it serves: give it the time to
            configured = {**server, "dataPath": PATHS[name], "warmupSeconds": 900 if "compile" in PATHS[name] else 60}
            rows.append(row(name, server, run(configured, users, args.seconds)))
            print(table(["config", "data path", "served rps", "p99 ms", "formed batch", "preprocess ms/batch",
                         "infer ms/batch", "raw rps (as served)", "served/raw", "what the workers ran"], rows),
                  flush=True)  # fmt: skip
    print(f"JPEG requests, {users} users, {args.seconds:g} s measured per row")


if __name__ == "__main__":
    main()
