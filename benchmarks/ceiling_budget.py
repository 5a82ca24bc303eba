"""What the ceiling step and the handler's warm-up cost, before and after they were bounded.

    .venv/bin/python benchmarks/ceiling_budget.py [--sizes 1 8 64 1024] [--raw-seconds 5] [--users 8]

For the ResNet-50 demo at each configured batch size, with the closed loop at 1 and `--users` users
(so the server forms batches of at most that many) and `ceiling.rawSeconds`:

* **before** (the former code, computed from one timed pass at every power of two, measured here):
  warm-up ran every power of two up to the batch size; the raw figure ran 3 warm-up passes and at
  least 2 passes in each of 5 segments at the configured batch size, whatever the budget;
* **after** (run for real): the handler's warm-up of the sizes the load can form within its time
  budget, and the raw probe (child process) at the formed size plus the best-of scan, within
  rawSeconds — its wall time, setup apart.
"""

from __future__ import annotations

import argparse
import time

from common import table

from servinglab.api import LoadSpec
from servinglab.measure import ceiling
from servinglab.measure.raw import probe as rawprobe
from servinglab.measure.raw.child import Probe
from servinglab.models import counting
from servinglab.servers.torchserve import config as tsconfig

OLD_WARMUP_PASSES, OLD_SEGMENTS, OLD_PASSES_PER_SEGMENT = 3, 5, 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64, 1024])
    parser.add_argument("--raw-seconds", type=float, default=5.0)
    parser.add_argument("--warmup-seconds", type=float, default=60.0)
    parser.add_argument("--users", type=int, default=8)
    args = parser.parse_args()

    warm_up = counting.handler_imaging().warm_up  # the handler's own function
    probe = Probe("resnet50", "fp32", "cpu")
    largest = max(args.sizes)
    pass_seconds: dict[int, float] = {}
    for size in sorted(set(tsconfig.powers_of_two_up_to(largest)) | set(args.sizes)):
        batch = probe.batch(size)
        probe.forward(batch)  # first pass apart: the figure is a steady pass
        pass_seconds[size] = probe.forward(batch)
        print(f"one pass at batch {size}: {pass_seconds[size]:.2f} s", flush=True)

    load = LoadSpec(concurrency=[1, args.users])
    rows = []
    for size in args.sizes:
        old_warmup = sum(pass_seconds[s] for s in tsconfig.warmup_batch_sizes(size, None))
        old_passes = OLD_WARMUP_PASSES + OLD_SEGMENTS * OLD_PASSES_PER_SEGMENT
        old_raw = max(args.raw_seconds, old_passes * pass_seconds[size])
        new_warmup = warm_up(lambda s: probe.forward(probe.batch(s)), tsconfig.warmup_batch_sizes(size, load),
                             args.warmup_seconds)  # fmt: skip
        formed = min(size, args.users)
        started = time.monotonic()
        figures = rawprobe.measure("resnet50", "fp32", "cpu", ceiling.scan_batch_sizes(formed, size), args.raw_seconds)
        wall = time.monotonic() - started
        rows.append([size, f"{old_warmup:.1f}", f"{new_warmup['seconds']:.1f} {new_warmup['batchSizes']}",
                     f"{old_raw:.1f} (batch {size})",
                     f"{figures.measure_seconds:.1f} + setup {figures.setup_seconds:.1f}",
                     f"{wall:.1f}", len(figures.measured), len(figures.skipped)])  # fmt: skip
    print(table(["batch size", "warm-up before s", "warm-up after s [sizes]", "raw before s", "raw after s",
                 "raw after wall s", "sizes measured", "sizes skipped"], rows))  # fmt: skip


if __name__ == "__main__":
    main()
