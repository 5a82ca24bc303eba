"""`servinglab loadtest`: the load generator as a standalone command (the Kubernetes Job's entry),
against a real TorchServe started from the same spec, writing the same per-level JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from servinglab import tsmetrics
from servinglab.local_server import LocalTorchServe
from servinglab.spec import ServerSpec

pytestmark = pytest.mark.torchserve


def test_loadtest_command_measures_a_running_server(
    servinglab_cmd: list[str], tiny_archive: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    experiment = {
        "apiVersion": "servinglab.dev/v1alpha1",
        "kind": "ServingExperiment",
        "metadata": {"name": "job"},
        "spec": {
            "model": {"name": "tiny"},
            "load": {
                "concurrency": [1, 3],
                "warmupSeconds": 0.5,
                "durationSeconds": 2,
                "payload": {"format": "raw"},
            },
        },
    }
    spec_file = tmp_path / "experiment.yaml"
    spec_file.write_text(yaml.safe_dump(experiment))
    server = LocalTorchServe("tiny", tiny_archive, ServerSpec(batch_size=4, max_batch_delay_ms=5), tmp_path / "ts")
    with server:
        server.wait_ready(120)
        before = tsmetrics.parse(server.metrics_text(), "tiny")
        output = tmp_path / "results.json"
        run = subprocess.run(
            [*servinglab_cmd, "loadtest", "--target", server.addresses.inference, "--model", "tiny",
             "--spec-file", str(spec_file), "--output", str(output),
             "--metrics-url", f"{server.addresses.metrics}/metrics",
             "--termination-log", str(tmp_path / "termination-log")],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        after = tsmetrics.parse(server.metrics_text(), "tiny")
    assert run.returncode == 0, run.stderr[-3000:]
    levels = json.loads(output.read_text())["results"]
    assert [level["concurrency"] for level in levels] == [1, 3]
    for level in levels:
        assert level["errors"] == 0
        assert level["throughputRps"] > 0
        assert level["latencyMs"]["p50"] <= level["latencyMs"]["p99"] <= level["latencyMs"]["max"]
        assert level["windowEnd"] - level["windowStart"] == pytest.approx(level["windowSeconds"], abs=0.01)
        assert level["server"]["serverRequests"] >= level["requests"]
    # Warm-up requests reached the server but are not in the measured counts.
    served = after["ts_inference_requests"] - before["ts_inference_requests"]
    assert served > sum(level["requests"] for level in levels)
    outcome = (tmp_path / "termination-log").read_text()
    assert outcome.startswith("2 levels measured") and outcome.endswith("0 errors")
