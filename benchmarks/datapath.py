"""What the handler's data path options change: served throughput, the handler's preprocess and inference
time per batch, and served/raw (the model alone run as served: compiled or channels-last too).

    .venv/bin/python benchmarks/datapath.py [--seconds 20] [--paths default,threads2,float,cl,compile]
    .venv/bin/python benchmarks/datapath.py --alone [--repeats 15]
    python3 benchmarks/datapath.py --gpu [--precision fp16] [--batch 64] [--workers 2] [--users 256]
                                   [--paths default,threads8,device,pinned8,device-cro,compile-cro]

Runs `servinglab run` (local TorchServe) with ResNet-50 and JPEG requests, once per data path. On the CPU:
fp32, 1 worker, closed loop at 4 users, at batch 4 (the best configuration of this machine's sweep) and
batch 1 (docs/benchmarks.md section 3: served/raw 0.97 and 0.64 before these options). With --gpu: one
GPU at the given precision, batch, workers and users, with the CUDA paths among the choices. Each row is
what the workers reported they ran (`runtime.dataPath`), so a path that did not take effect shows.

With --alone, no server: the handler's own data path in this process (the batch made from 224x224 JPEG
bodies by each CPU option, then ResNet-50's forward pass eager, channels-last and compiled), best and median
of --repeats, so that a busy shared machine (whose load spoils served figures) still shows what each option
changes in the work itself.
"""

from __future__ import annotations

import argparse
import json
import os
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
            f"{over_raw:.3g}" if over_raw else "-", f"{os.getloadavg()[0]:.1f}",
            ran.get("note", "(not reported)")]  # fmt: skip


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
    parser.add_argument("--alone", action="store_true", help="The data path and the model in-process, no server.")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    if args.alone:
        alone(args.repeats)
        return
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
                         "infer ms/batch", "raw rps (as served)", "served/raw", "load avg", "what the workers ran"],
                        rows),
                  flush=True)  # fmt: skip
    print(f"JPEG requests, {users} users, {args.seconds:g} s measured per row")


def _timed(work: Any, repeats: int) -> tuple[float, float]:
    """(best, median) milliseconds of `work()` over `repeats` runs."""
    import statistics
    import time

    spent = []
    for _ in range(repeats):
        begun = time.perf_counter()
        work()
        spent.append((time.perf_counter() - begun) * 1e3)
    return min(spent), statistics.median(spent)


def alone(repeats: int) -> None:
    """The CPU data path's options and the model's, in this process (the handler's own helpers)."""
    import time

    import torch

    from servinglab.api import PayloadFormat
    from servinglab.loadgen.payloads import make_payloads
    from servinglab.models import counting

    imaging, datapath = counting.handler_imaging(), counting.handler_datapath()  # the handler's own helpers
    BatchMaker, compile_model, plan_data_path = datapath.BatchMaker, datapath.compile_model, datapath.plan_data_path
    apply_precision, plan_precision = imaging.apply_precision, imaging.plan_precision

    cpu, rows = torch.device("cpu"), []
    for batch in (4, 32):
        bodies = make_payloads(PayloadFormat.JPEG, 224, batch, seed=7)
        for name in ("default", "threads2", "float", "float-threads2", "cl"):
            plan = plan_data_path(PATHS[name], cpu, "image", batch)
            maker = BatchMaker(plan, cpu, torch.float32, {"kind": "image", "size": 224})
            best, median = _timed(lambda m=maker, b=bodies: m.make(b), repeats)
            rows.append([f"make a batch of {batch} (decode, convert)", name, best, median, "-"])
    network, _ = counting.network("resnet50", weights=True)
    precision = plan_precision("fp32", cpu)
    batch4 = torch.randn(4, 3, 224, 224)
    for name in ("default", "cl", "compile"):
        plan = plan_data_path(PATHS[name], cpu, "image", 4)
        model = apply_precision(network, precision, plan.channels_last)
        begun = time.perf_counter()
        model = compile_model(model, plan)
        data = batch4.contiguous(memory_format=torch.channels_last) if plan.channels_last else batch4
        for _ in range(2):  # the first pass compiles (or picks kernels): not timed
            BatchMaker(plan, cpu, torch.float32, {"size": 224}).forward(model, data)
        setup = time.perf_counter() - begun
        best, median = _timed(lambda p=plan, m=model, d=data: BatchMaker(p, cpu, torch.float32, {}).forward(m, d),
                              max(3, repeats // 3))  # fmt: skip
        rows.append(["ResNet-50 forward, batch 4", name, best, median, f"{setup:.1f}"])
        network = network.to(memory_format=torch.contiguous_format)
    print(table(["what", "data path", "best ms", "median ms", "setup s (compile)"], rows))
    print(f"{torch.get_num_threads()} torch threads, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
