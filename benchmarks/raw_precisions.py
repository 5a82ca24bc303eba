"""The model alone at each precision: raw throughput per batch size and its share of the accelerator's peak.

    .venv/bin/python benchmarks/raw_precisions.py [--model resnet50] [--precisions fp32,tf32,fp16,bf16]
                                                  [--sizes 1,8,32,64,128,256] [--seconds 30]

For each precision, one `servinglab.measure.raw.child` child (the ceiling's own probe: the model converted
exactly as the handler converts it, random inputs already on the device, every pass synchronised)
measures the batch sizes in turn within `--seconds`. Prints raw inferences/s, the fastest pass, the
theoretical rate from the peak table (`servinglab.measure.ceiling.PEAK_TFLOPS`, dense tensor-core figures)
and raw/theoretical. Needs a GPU for the tf32/fp16/bf16 rows to mean anything.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from common import table

from servinglab.measure import ceiling
from servinglab.models.counting import count_flops


def probe(
    model: str, precision: str, device: str, sizes: list[int], seconds: float
) -> tuple[str, list[dict[str, Any]]]:
    request = {"model": model, "precision": precision, "device": device, "batchSizes": sizes, "seconds": seconds}
    child = subprocess.run([sys.executable, "-m", "servinglab.measure.raw.child", json.dumps(request)],
                           capture_output=True, text=True, check=True)  # fmt: skip
    events = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    device = next(event["device"] for event in events if event["event"] == "ready")
    rows = [event for event in events if event["event"] in ("measured", "skipped")]
    return device, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--precisions", default="fp32,tf32,fp16,bf16")
    parser.add_argument("--sizes", default="1,8,32,64,128,256")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    flops = count_flops(args.model)
    table_rows, device = [], "?"
    for precision in args.precisions.split(","):
        device, rows = probe(args.model, precision, args.device, sizes, args.seconds)
        peak = ceiling.PEAK_TFLOPS.get(ceiling.accelerator_of(device) or "", {}).get(precision)
        theoretical = ceiling.theoretical_rps(flops, peak)
        for row in rows:
            if row["event"] == "skipped":
                table_rows.append([precision, row["batchSize"], "skipped", "-", "-", "-", str(row["reason"])])
                continue
            rps = float(row["throughputRps"])
            share = f"{rps / theoretical:.3f}" if theoretical else "-"
            table_rows.append([precision, row["batchSize"], f"{rps:.0f}", f"{float(row['passSeconds']) * 1e3:.2f}",
                               f"{theoretical:.0f}" if theoretical else "-", share, row.get("note") or ""])  # fmt: skip
    print(f"{args.model}: {flops / 1e9:.2f} GFLOPs per inference; device {device}; {args.seconds:g} s per precision")
    print(table(["precision", "batch", "raw rps", "fastest pass ms", "theoretical rps", "raw/theoretical", "note"],
                table_rows))  # fmt: skip


if __name__ == "__main__":
    main()
