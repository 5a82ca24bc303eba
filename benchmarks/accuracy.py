"""Accuracy: the same TorchServe and the same load measured by servinglab and by wrk (Debian).

    .venv/bin/python benchmarks/accuracy.py [--seconds 20] [--model tiny]

For each concurrency, servinglab's closed loop (`servinglab loadtest`, warm-up excluded) and
`wrk -t1 -cN` (after its own discarded warm-up run) send the same JPEG to the same TorchServe, in
alternating rounds. Prints the median throughput and p50/p99 of each tool, their ranges, and the
difference of the medians. wrk's percentiles come from its
HdrHistogram (microsecond resolution); servinglab's are exact nearest-rank values over every request.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from common import experiment, payload_file, servinglab_loadtest, table, torchserve, wrk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--levels", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    server = {"batchSize": 8, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32"}
    load = {"concurrency": levels, "warmupSeconds": 3, "durationSeconds": args.seconds,
            "payload": {"format": "jpeg", "variants": 1}}  # fmt: skip
    document = experiment("accuracy", args.model, server, load)
    rows = []
    with torchserve(document) as (url, model), tempfile.TemporaryDirectory() as folder:
        body, content_type = payload_file(document, Path(folder))
        target = f"{url}/predictions/{model}"
        for level in levels:
            level_document = {**document, "spec": {**document["spec"], "load": {**load, "concurrency": [level]}}}
            ours, theirs = [], []
            for round_number in range(args.rounds):
                # alternate who goes first: a shared 2-core machine drifts between runs
                for tool in ("servinglab", "wrk") if round_number % 2 == 0 else ("wrk", "servinglab"):
                    if tool == "servinglab":
                        ours.append(servinglab_loadtest(url, model, level_document)["results"][0])
                    else:
                        wrk(target, level, 3, body, content_type)  # warm-up, discarded
                        theirs.append(wrk(target, level, args.seconds, body, content_type))
            rows += compare(level, ours, theirs)
    print(
        f"model {args.model}, batch 8, delay 5 ms, 1 worker, fp32; {args.rounds} alternating rounds of "
        f"{args.seconds:g} s per tool and level (medians; range in brackets); one machine, 2 cores shared"
    )
    print(table(["concurrency", "figure", "servinglab", "wrk", "difference of medians"], rows))


def compare(level: int, ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[list[Any]]:
    def figures(results: list[dict[str, Any]], name: str) -> list[float]:
        if name == "throughputRps":
            return [r["throughputRps"] for r in results]
        return [r["latencyMs"][name] for r in results]

    rows = []
    for name, label in (("throughputRps", "throughput rps"), ("p50", "p50 ms"), ("p99", "p99 ms")):
        a, b = figures(ours, name), figures(theirs, name)
        ma, mb = statistics.median(a), statistics.median(b)
        rows.append([level, label, f"{ma:.1f} [{min(a):.1f}–{max(a):.1f}]", f"{mb:.1f} [{min(b):.1f}–{max(b):.1f}]",
                     f"{(ma - mb) / mb:+.1%}"])  # fmt: skip
    cpu = [r["generator"]["cpuPercent"] for r in ours]
    saturated = any(r["generator"]["saturated"] for r in ours)
    rows.append([level, "servinglab generator CPU %", f"{statistics.median(cpu):.1f}", "-",
                 "saturated" if saturated else "not saturated"])  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
