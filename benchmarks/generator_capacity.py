"""Generator capacity: the highest request rate one servinglab load-generator process sustains
against a trivial endpoint (nginx answering "ok"), next to wrk's (Debian) on the same endpoint.

    .venv/bin/python benchmarks/generator_capacity.py [--seconds 8]

* closed loop: `servinglab loadtest` with N users, throughput and the generator's own CPU;
* open loop: offered rates rising until the generator flags itself (CPU or send lag) or cannot keep
  the rate (sent < 98 % of offered, or more than 1 % late sends); the last rate it kept is its capacity;
* wrk -t1 -cN on the same endpoint: the independent reference (C, epoll, one thread).
"""

from __future__ import annotations

import argparse

from common import experiment, kept, nginx, servinglab_loadtest, table, wrk

RATES = (500, 1000, 1500, 2000, 3000, 4000, 6000, 8000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--users", default="1,8,32")
    args = parser.parse_args()
    users = [int(u) for u in args.users.split(",")]
    payload = {"format": "jpeg", "variants": 1}
    rows = []
    with nginx() as url:
        for count in users:
            load = {"concurrency": [count], "warmupSeconds": 2, "durationSeconds": args.seconds, "payload": payload}
            (level,) = servinglab_loadtest(url, "tiny", experiment("capacity", "tiny", {}, load))["results"]
            reference = wrk(f"{url}/predictions/tiny", count, args.seconds)
            rows.append([f"closed loop, {count} users", level["throughputRps"], level["latencyMs"]["p99"],
                         level["generator"]["cpuPercent"], "yes" if level["generator"]["saturated"] else "no",
                         reference["throughputRps"], reference["latencyMs"]["p99"]])  # fmt: skip
        capacity = None
        for rate in RATES:
            load = {"mode": "open", "arrival": "poisson", "rates": [rate], "warmupSeconds": 2,
                    "durationSeconds": args.seconds, "payload": payload}  # fmt: skip
            (level,) = servinglab_loadtest(url, "tiny", experiment("capacity", "tiny", {}, load))["results"]
            sent = level["openLoop"]
            rows.append([f"open loop, {rate} rps offered", level["throughputRps"], level["latencyMs"]["p99"],
                         level["generator"]["cpuPercent"],
                         ("yes: " + level["generator"].get("reason", "")) if level["generator"]["saturated"]
                         else f"no (sent {sent['sentRps']:.0f}/s, late {sent['lateSends']})", "-", "-"])  # fmt: skip
            if not kept(level):
                break
            capacity = rate
    print(f"endpoint: nginx 'return 200' on 127.0.0.1; {args.seconds:g} s per level; one machine, 2 cores")
    print(table(["load", "servinglab rps", "p99 ms", "generator CPU %", "flagged", "wrk rps", "wrk p99 ms"], rows))
    print(f"open-loop capacity of one servinglab process: {capacity} rps (highest rate kept without a flag)")


if __name__ == "__main__":
    main()
