"""Load-generator scaling: one servinglab process against stock Locust, N processes against one,
the open-loop rate kept per process and merged, and how closely a trace replay holds its schedule.

    .venv/bin/python benchmarks/generator_scaling.py [--seconds 8] [--users 32] [--processes 2]

All against nginx answering "ok" on loopback (faster than any generator here), the same payload
(one JPEG body) and the same users, one after the other on this machine:

* closed loop: stock Locust (`FastHttpUser`, one process, headless, its own statistics) next to
  `servinglab loadtest` with 1 and N generator processes (every latency recorded), and wrk -t1 as the
  C reference;
* open loop: Poisson rates rising until the generator flags itself or falls behind the schedule,
  with 1 and N processes (the last rate kept is the capacity);
* trace replay: a constant-rate trace at a rate one process keeps; the p99 of how late each send
  left its scheduled time (the generator's `sendGapMs` in the open loop).
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from common import SERVINGLAB, experiment, kept, nginx, servinglab_loadtest, table, wrk

RATES = (1000, 1500, 2000, 2500, 3000, 4000, 5000, 6000, 8000, 10000, 12000)

STOCK_LOCUSTFILE = """
from locust import FastHttpUser, constant, task

BODY = open({body!r}, "rb").read()


class Stock(FastHttpUser):
    wait_time = constant(0)

    @task
    def predict(self):
        self.client.post("/predictions/tiny", data=BODY, headers={{"Content-Type": "image/jpeg"}})
"""


def stock_locust(url: str, users: int, seconds: float, body: Path) -> dict[str, float]:
    """Locust's own CLI, one process, headless; its aggregated requests/s and p99 (its buckets)."""
    with tempfile.TemporaryDirectory() as folder:
        locustfile = Path(folder) / "locustfile.py"
        locustfile.write_text(STOCK_LOCUSTFILE.format(body=str(body)))
        prefix = Path(folder) / "stock"
        subprocess.run(
            [str(Path(SERVINGLAB).with_name("locust")), "-f", str(locustfile), "--headless", "-u", str(users),
             "-r", str(users), "-t", f"{seconds:g}s", "--host", url, "--csv", str(prefix), "--only-summary"],
            capture_output=True, text=True, check=True, timeout=seconds + 60,
        )  # fmt: skip
        with open(f"{prefix}_stats.csv") as stats:
            aggregated = next(row for row in csv.DictReader(stats) if row["Name"] == "Aggregated")
    return {"throughputRps": float(aggregated["Requests/s"]), "p99": float(aggregated["99%"])}


def capacity(url: str, processes: int, seconds: float, payload: dict[str, Any], rows: list[list[Any]]) -> float:
    best = 0.0
    for rate in RATES:
        load = {"mode": "open", "arrival": "poisson", "rates": [rate], "warmupSeconds": 2, "durationSeconds": seconds,
                "payload": payload, "generators": processes}  # fmt: skip
        (level,) = servinglab_loadtest(url, "tiny", experiment("scaling", "tiny", {}, load))["results"]
        generator, sent = level["generator"], level["openLoop"]
        flag = ("yes: " + generator.get("reason", "")) if generator["saturated"] else "no"
        rows.append([f"open loop, {processes} process(es), {rate} rps", level["throughputRps"],
                     level["latencyMs"]["p99"], generator["cpuPercent"], f"{flag} (sent {sent['sentRps']:.0f}/s, "
                     f"late {sent['lateSends']})"])  # fmt: skip
        if not kept(level):
            break
        best = rate
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--trace-rps", type=float, default=800.0)
    args = parser.parse_args()
    payload = {"format": "jpeg", "variants": 1}
    rows: list[list[Any]] = []
    folder = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    body = folder / "body.jpg"
    from servinglab.api import PayloadFormat
    from servinglab.loadgen.payloads import make_payloads

    body.write_bytes(make_payloads(PayloadFormat.JPEG, 224, 1, seed=0)[0])
    with nginx() as url:
        stock = stock_locust(url, args.users, args.seconds, body)
        rows.append([f"closed loop, stock Locust FastHttpUser, {args.users} users", stock["throughputRps"],
                     stock["p99"], "-", "- (Locust's buckets)"])  # fmt: skip
        closed: dict[int, float] = {}
        for processes in (1, args.processes):
            load = {"concurrency": [args.users], "warmupSeconds": 2, "durationSeconds": args.seconds,
                    "payload": payload, "generators": processes}  # fmt: skip
            (level,) = servinglab_loadtest(url, "tiny", experiment("scaling", "tiny", {}, load))["results"]
            closed[processes] = level["throughputRps"]
            generator = level["generator"]
            cpu = [g["cpuPercent"] for g in generator.get("perGenerator", [generator])]
            rows.append([f"closed loop, servinglab, {processes} process(es), {args.users} users",
                         level["throughputRps"], level["latencyMs"]["p99"], "/".join(f"{c:.0f}" for c in cpu),
                         "yes" if generator["saturated"] else "no"])  # fmt: skip
        reference = wrk(f"{url}/predictions/tiny", args.users, args.seconds, body, "image/jpeg")
        rows.append([f"closed loop, wrk -t1 -c{args.users}", reference["throughputRps"], reference["latencyMs"]["p99"],
                     "-", "-"])  # fmt: skip
        kept_rates = {
            processes: capacity(url, processes, args.seconds, payload, rows) for processes in (1, args.processes)
        }

        trace = folder / "trace.csv"
        count = int(args.trace_rps * args.seconds)
        trace.write_text("".join(f"{i / args.trace_rps:.6f}\n" for i in range(count)))
        load = {"mode": "open", "shape": {"trace": {"file": "trace.csv"}}, "warmupSeconds": 2, "payload": payload}
        document = experiment("scaling", "tiny", {}, load)
        (level,) = servinglab_loadtest(url, "tiny", document, payload_dir=folder)["results"]
        lag = level["generator"]["sendGapMs"]
        rows.append([f"trace replay, {args.trace_rps:g} rps constant, 1 process", level["throughputRps"],
                     level["latencyMs"]["p99"], level["generator"]["cpuPercent"],
                     f"send lateness p50 {lag['p50']} ms, p99 {lag['p99']} ms, max {lag['max']} ms"])  # fmt: skip
    shutil.rmtree(folder, ignore_errors=True)
    print(f"endpoint: nginx 'return 200' on 127.0.0.1; {args.seconds:g} s per level; this machine")
    print(table(["load", "rps", "p99 ms", "generator CPU %", "flagged / notes"], rows))
    ratio = closed[args.processes] / closed[1] if closed[1] else 0.0
    print(
        f"closed loop: servinglab 1 process {closed[1]:.0f} rps = {closed[1] / stock['throughputRps']:.2f} x stock "
        f"Locust; {args.processes} processes {closed[args.processes]:.0f} rps = {ratio:.2f} x one process"
    )
    print(
        f"open loop, Poisson, highest rate kept: 1 process {kept_rates[1]:g} rps, {args.processes} processes "
        f"{kept_rates[args.processes]:g} rps"
    )


if __name__ == "__main__":
    main()
