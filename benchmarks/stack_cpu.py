"""The stack on one machine: the demo model's served/raw (and, on a GPU, served/theoretical) ratio.

    .venv/bin/python benchmarks/stack_cpu.py [--seconds 20]
    python3 benchmarks/stack_cpu.py --gpu [--precisions fp32,tf32,fp16,bf16] [--batch 64] [--workers 2]
                                          [--users 256] [--format jpeg|raw]

Runs `servinglab run` (local TorchServe) with ResNet-50. On the CPU: the configuration that served
the most on this 2-core machine in the configuration sweep (batch 4, max delay 20 ms, 1 worker, fp32;
closed loop at 4 users) and batch 1 for comparison. With --gpu: one GPU, the given batch size,
workers and users at each precision. Each result carries its ceiling block: FLOPs per inference
counted from the model, the model alone in-process at the batch size TorchServe formed and the same
precision, served/raw, and served/theoretical from the accelerator peak table.
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


def configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.gpu:
        return [{"batchSize": args.batch, "maxBatchDelayMs": args.delay, "workers": args.workers, "precision": p,
                 "gpus": 1} for p in args.precisions.split(",")]  # fmt: skip
    return [{"batchSize": b, "maxBatchDelayMs": 20, "workers": 1, "precision": "fp32"} for b in (4, 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--gpu", action="store_true", help="Run on the GPU at each of --precisions.")
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--delay", type=int, default=10)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--format", default="jpeg", choices=["jpeg", "png", "raw"])
    args = parser.parse_args()
    users = [args.users] if args.gpu else [4]
    rows = []
    for server in configs(args):
        load = {"concurrency": users, "warmupSeconds": 5, "durationSeconds": args.seconds,
                "payload": {"format": args.format}}  # fmt: skip
        document = experiment("stack", "resnet50", server, load)
        document["spec"]["ceiling"] = {"rawSeconds": 10}
        with tempfile.TemporaryDirectory() as folder:
            spec_file, out = Path(folder) / "experiment.yaml", Path(folder) / "results.json"
            spec_file.write_text(yaml.safe_dump(document))
            subprocess.run([SERVINGLAB, "run", str(spec_file), "--output", str(out)], check=True)
            results = json.loads(out.read_text())
        ceiling, level = results["ceiling"], results["results"][0]
        theoretical = f"{ceiling['servedOverTheoretical']:.3g}" if ceiling.get("servedOverTheoretical") else "-"
        rows.append([f"b{server['batchSize']} d{server['maxBatchDelayMs']} w{server['workers']} {server['precision']}",
                     level["concurrency"], level["throughputRps"], level["latencyMs"]["p99"],
                     (level.get("server") or {}).get("meanBatchSize", "-"), ceiling["rawAtFormedBatchRps"],
                     f"{ceiling['servedOverRaw']:.3g}", f"{ceiling['flopsPerInference'] / 1e9:.2f}", theoretical,
                     "saturated" if level.get("generator", {}).get("saturated") else ""])  # fmt: skip
    print(f"payload {args.format}; {args.seconds:g} s measured per configuration")
    print(table(["config", "users", "served rps", "p99 ms", "formed batch", "raw rps at the formed batch",
                 "served/raw", "GFLOPs", "served/theoretical", "generator"], rows))  # fmt: skip


if __name__ == "__main__":
    main()
