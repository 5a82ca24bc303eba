"""A load that holds a utilisation, end to end on CPU: `servinglab run` against a real TorchServe whose CPU
use is known. Its one Python worker (the process whose CPU counts) runs the tiny model on one thread
(OMP_NUM_THREADS=1), so it uses at most one of the cores the server may run on: a closed loop asked for 0.99
of them never gets there, and says that the server is at its limit; an open loop asked for half of what
that worker used at one user gets there by raising its rate (the worker's CPU per request does not change
with the rate), and reports the level it measured there and the probes that led to it. The generator's own
limits are relaxed: on a shared host its send gaps would otherwise end a search as generator-bound, which
is the right answer there, and not the one these runs are about."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from servinglab.measure.telemetry import usable_cores
from support import manifests

pytestmark = [
    pytest.mark.torchserve,
    pytest.mark.skipif(usable_cores() < 2, reason="one worker's one thread must be short of all the cores"),
]


def run(servinglab_cmd: list[str], folder: Path, name: str, load: dict[str, Any]) -> tuple[dict[str, Any], str]:
    experiment = manifests.experiment(
        name, server={"batchSize": 1, "maxBatchDelayMs": 1, "workers": 1, "gpus": 0}, ceiling={"enabled": False},
        load={"warmupSeconds": 1, "durationSeconds": 3, "payload": {"format": "png"},
              "stability": {"windowSeconds": 1, "windows": 2, "tolerance": 1.0},
              "generator": {"maxCpuPercent": 100, "maxSendGapMs": 10000}, **load},
    )  # fmt: skip
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(experiment))
    done = subprocess.run(
        [*servinglab_cmd, "run", f"{name}.yaml", "--output", f"{name}.json"], cwd=folder, capture_output=True,
        text=True, timeout=300, check=False, env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / f"{name}.json").read_text()), done.stdout


def test_a_utilisation_one_worker_cannot_give_is_never_reached_and_half_of_it_is(
    servinglab_cmd: list[str], tmp_path: Path, no_leftover_servers: float
) -> None:
    aim = {"target": 0.99, "tolerance": 0.04, "resource": "cpu", "maxProbes": 8}
    beyond, said = run(servinglab_cmd, tmp_path, "beyond", {"mode": "closed", "utilisationTarget": aim})
    search = beyond["utilisation"]
    assert (search["reached"], search["reason"], search["resource"]) == (False, "server-limit", "cpu"), search
    steps = search["steps"]
    users = [step["concurrency"] for step in steps]
    assert users == [2**i for i in range(len(users))] and 2 <= len(users) <= 8, "doubled until the plateau"
    assert len(beyond["results"]) == len(steps) == search["probes"]
    assert all(step["utilisation"] < 0.95 for step in steps), "one thread of the worker: at most one core"
    assert "never reached: server-limit" in said

    # The worker's CPU at one user is known now, and it grows with the rate it serves: ask for half of it.
    one_user = steps[0]
    half = one_user["utilisation"] / 2
    aim = {"target": round(half, 3), "tolerance": round(half / 2, 3), "resource": "cpu", "maxProbes": 6,
           "start": round(one_user["throughputRps"] / 8, 3), "probeSeconds": 2}  # fmt: skip
    held, said = run(
        servinglab_cmd, tmp_path, "held", {"mode": "open", "arrival": "constant", "utilisationTarget": aim}
    )
    search = held["utilisation"]
    assert search["reached"] and search.get("reason") is None, search
    rates = [step["rateRps"] for step in search["steps"]]
    assert rates[0] == aim["start"] and 1 <= len(rates) <= 6
    landed = search["steps"][-1]
    assert abs(landed["utilisation"] - aim["target"]) <= aim["tolerance"], "the last probe held the target"
    assert all(abs(step["utilisation"] - aim["target"]) > aim["tolerance"] for step in search["steps"][:-1])
    # ...then the load found was measured for durationSeconds, as the last level of the document
    assert len(held["results"]) == len(rates) + 1 and search["levelIndex"] == len(rates)
    measured = held["results"][-1]
    assert measured["rateRps"] == landed["rateRps"] == search["rateRps"]
    assert search["throughputRps"] == measured["throughputRps"] and search["latencyMs"]["p99"] > 0
    assert f"held at {search['rateRps']:g} rps" in said
