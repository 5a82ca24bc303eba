"""The stack on this machine: the demo model's served/raw ratio at the best configuration found.

    .venv/bin/python benchmarks/stack_cpu.py [--seconds 20]

Runs `servinglab run` (local TorchServe) with ResNet-50 at the configuration that served the most
on this 2-core CPU in the configuration sweep (batch 4, max delay 20 ms, 1 worker, fp32; closed
loop at 4 users) and at batch 1 for comparison; each result carries its ceiling block: FLOPs per
inference counted from the model, the model alone in-process at the same batch size and precision,
and served/raw. On a GPU machine pass --gpu (the same at fp32 and fp16, with served/theoretical
from the accelerator peak table).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import yaml
from common import SERVINGLAB, experiment, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--gpu", action="store_true", help="Run on the GPU at fp32 and fp16.")
    args = parser.parse_args()
    configs = (
        [{"batchSize": 16, "maxBatchDelayMs": 10, "workers": 1, "precision": p, "gpus": 1} for p in ("fp32", "fp16")]
        if args.gpu
        else [{"batchSize": b, "maxBatchDelayMs": 20, "workers": 1, "precision": "fp32"} for b in (4, 1)]
    )
    users = [64] if args.gpu else [4]
    rows = []
    for server in configs:
        load = {"concurrency": users, "warmupSeconds": 5, "durationSeconds": args.seconds,
                "payload": {"format": "jpeg"}}  # fmt: skip
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
                     ceiling["rawAtFormedBatchRps"], f"{ceiling['servedOverRaw']:.2f}",
                     f"{ceiling['flopsPerInference'] / 1e9:.2f}",
                     theoretical])  # fmt: skip
    print(table(["config", "users", "served rps", "p99 ms", "raw rps at the formed batch", "served/raw", "GFLOPs",
                 "served/theoretical"], rows))  # fmt: skip


if __name__ == "__main__":
    main()
