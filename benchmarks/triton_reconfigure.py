"""What a sweep's next configuration costs on Triton: loading a new config.pbtxt through the repository API
(what the local sweep does) against stopping tritonserver and starting it again with that config.

    .venv/bin/python benchmarks/triton_reconfigure.py [--model resnet50] [--rounds 3]

Each round goes from (batch 1, 1 instance) to (batch 8, 2 instances) and back, both ways; the seconds are
until Triton says the model is READY with the new configuration (every instance loaded and warmed up).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from common import table

from servinglab import servers
from servinglab.api import ExperimentSpec, ServerSpec
from servinglab.servers.triton.local import LocalTriton

CONFIGS = (
    {"kind": "triton", "gpus": 0, "batchSize": 1, "maxBatchDelayMs": 1, "workers": 1},
    {"kind": "triton", "gpus": 0, "batchSize": 8, "maxBatchDelayMs": 5, "workers": 2},
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spec = ExperimentSpec.model_validate({"model": {"name": args.model}, "server": CONFIGS[0]})
    workdir = Path(tempfile.mkdtemp(prefix="bench-triton-reconfigure-"))
    served = servers.get("triton").prepare_model(spec, workdir).directory
    reloaded: list[float] = []
    restarted: list[float] = []
    try:
        for round_number in range(args.rounds):
            for first, second in ((0, 1), (1, 0)):
                server = LocalTriton(args.model, served, ServerSpec.model_validate(CONFIGS[first]), workdir / "a")
                server.start()
                server.wait_ready(600)
                reloaded.append(server.reconfigure(ServerSpec.model_validate(CONFIGS[second])))
                started = time.monotonic()
                server.stop()
                again = LocalTriton(args.model, served, ServerSpec.model_validate(CONFIGS[second]), workdir / "b")
                again.start()
                again.wait_ready(600)
                restarted.append(time.monotonic() - started)
                again.stop()
            print(f"round {round_number + 1}: reload {reloaded[-2:]}, restart {restarted[-2:]}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = [
        ["repository API load (new config.pbtxt)", statistics.median(reloaded), min(reloaded), max(reloaded)],
        ["stop tritonserver, start it again", statistics.median(restarted), min(restarted), max(restarted)],
    ]
    print(f"model {args.model}, CPU, {args.rounds} rounds of batch 1 x 1 instance <-> batch 8 x 2 instances")
    print(table(["next configuration by", "median s", "min s", "max s"], rows))


if __name__ == "__main__":
    main()
