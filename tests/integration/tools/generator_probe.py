"""Run one load level with servinglab's generators and print its results entry as JSON.

    python generator_probe.py URL closed|open LEVEL SECONDS [--max-in-flight N] [--starve] [--generators N]
                              [--cpu N]

--starve runs a greenlet that keeps the generator's event loop busy (50 ms of CPU at a time), the
way an overloaded load-generator process behaves; its results must be flagged. --generators N splits
the level between N processes (the entry then carries every generator's samples under "samples").
--cpu N keeps the generator on core N (to share it with another busy process).
"""

from __future__ import annotations

from locust import events  # noqa: F401  - gevent monkey-patching first, as servinglab.entry does

import argparse
import json
import os
import time

import gevent

from servinglab.loadgen import closed_loop, generators, open_loop
from servinglab.loadgen.payloads import Payload


def hog() -> None:
    while True:
        until = time.perf_counter() + 0.05
        while time.perf_counter() < until:
            pass
        gevent.sleep(0.001)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("mode", choices=["closed", "open"])
    parser.add_argument("level", type=float)
    parser.add_argument("seconds", type=float)
    parser.add_argument("--max-in-flight", type=int, default=1024)
    parser.add_argument("--starve", action="store_true")
    parser.add_argument("--generators", type=int, default=1)
    parser.add_argument("--cpu", type=int)
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.starve:
        gevent.spawn(hog)
    common = {"target": args.url, "path": "/predict", "payloads": [Payload(b"x" * 64, "application/octet-stream")],
              "request_timeout_seconds": 30.0}  # fmt: skip
    plan: closed_loop.LoadPlan | open_loop.OpenLoopPlan
    if args.mode == "closed":
        plan = closed_loop.LoadPlan(**common)
    else:
        plan = open_loop.OpenLoopPlan(**common, arrival="constant", max_in_flight=args.max_in_flight)
    if args.generators > 1:
        with generators.GeneratorPool(plan, local=args.generators) as pool:
            stats = pool.run_level(args.level, 0, 0.5, args.seconds)
        samples = [[s.sent_at, s.latency_ms, s.error] for s in stats.samples]
        print(json.dumps({**stats.to_json(), "samples": samples}))
        return
    if isinstance(plan, closed_loop.LoadPlan):
        (stats,) = closed_loop.run_levels(plan, [int(args.level)], 0.5, args.seconds)
    else:
        (stats,) = open_loop.run_rates(plan, [args.level], 0.5, args.seconds)
    print(json.dumps(stats.to_json()))


if __name__ == "__main__":
    main()
