"""A user's own model, end to end: a TorchScript file served with servinglab's handler at each precision.

    python3 benchmarks/own_model.py [--torchvision resnet50] [--precisions fp32,fp16,bf16] [--gpu]
                                    [--batch 64] [--workers 2] [--users 256] [--seconds 10] [--format jpeg]

Saves the model as a user would (`torch.jit.save` of a scripted torchvision model with seeded
weights; torchvision must be installed, it is not a servinglab dependency), then runs
`servinglab run` with `model.source.path` pointing at the file and `model.input` declaring a 224 px
image: the path every user model takes (recognised, digested, packed with the precision handler,
parameters and FLOPs counted), and the ceiling measured on the same file. Prints what ran (the
worker's own precision statement), served throughput and p99, served/raw and served/theoretical.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import torch
import yaml
from common import SERVINGLAB, table


def save_torchscript(name: str, folder: Path) -> Path:
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    path = folder / f"{name}.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchvision", default="resnet50")
    parser.add_argument("--precisions", default="fp32,fp16,bf16")
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--users", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--format", default="jpeg", choices=["jpeg", "png", "raw"])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        model_file = save_torchscript(args.torchvision, folder)
        for precision in args.precisions.split(","):
            document = {
                "apiVersion": "servinglab.dev/v1alpha1", "kind": "ServingExperiment",
                "metadata": {"name": f"own-{precision}"},
                "spec": {
                    "model": {"name": args.torchvision, "source": {"path": str(model_file)},
                              "input": {"kind": "image", "size": 224}},
                    "server": {"gpus": 1 if args.gpu else 0, "batchSize": args.batch, "maxBatchDelayMs": 10,
                               "workers": args.workers, "precision": precision},
                    "load": {"concurrency": [args.users], "warmupSeconds": 5, "durationSeconds": args.seconds,
                             "payload": {"format": args.format}},
                    "ceiling": {"rawSeconds": 5},
                },
            }  # fmt: skip
            spec_file, out = folder / f"{precision}.yaml", folder / f"{precision}.json"
            spec_file.write_text(yaml.safe_dump(document))
            subprocess.run([SERVINGLAB, "run", str(spec_file), "--output", str(out)], check=True)
            results = json.loads(out.read_text())
            info, level, ceiling = results["modelInfo"], results["results"][0], results.get("ceiling") or {}
            rows.append([precision, results["runtime"]["precisionNote"], level["throughputRps"],
                         level["latencyMs"]["p99"], ceiling.get("rawAtFormedBatchRps", "-"),
                         ceiling.get("servedOverRaw", "-"), ceiling.get("servedOverTheoretical") or "-"])  # fmt: skip
    print(
        f"{args.torchvision} as TorchScript: {info['sizeBytes'] / 2**20:.1f} MiB, sha256 {info['sha256'][:12]}…, "
        f"{info['parameters'] / 1e6:.2f} M parameters, {(info['flopsPerInference'] or 0) / 1e9:.2f} GFLOPs; "
        f"batch {args.batch}, {args.workers} workers, {args.users} users, {args.format}, {args.seconds:g} s"
    )
    print(table(["precision", "what ran (the worker's words)", "served rps", "p99 ms", "raw rps at the formed batch",
                 "served/raw", "served/theoretical"], rows))  # fmt: skip


if __name__ == "__main__":
    main()
