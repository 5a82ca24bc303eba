"""`servinglab loadtest`: the load generator as a standalone command (the Kubernetes Job's entry),
against a real TorchServe started from the same spec, writing the same per-level JSON."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from servinglab.api import ServerSpec
from servinglab.servers.torchserve import metrics as tsmetrics
from servinglab.servers.torchserve.local import LocalTorchServe
from support import manifests
from support.serving import ready_server

pytestmark = pytest.mark.torchserve


def test_loadtest_command_measures_a_running_server(
    servinglab_cmd: list[str], tiny_archive: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    experiment = manifests.experiment(
        "job", load={"concurrency": [1, 3], "warmupSeconds": 0.5, "durationSeconds": 2, "payload": {"format": "raw"}}
    )
    spec_file = tmp_path / "experiment.yaml"
    spec_file.write_text(yaml.safe_dump(experiment))
    spec = ServerSpec(batch_size=4, max_batch_delay_ms=5)
    with ready_server(lambda: LocalTorchServe("tiny", tiny_archive, spec, tmp_path / "ts"), 120) as (server, _):
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


class _SlowAfterFirst(BaseHTTPRequestHandler):
    """Answers the first prediction at once (the pre-flight) and every later one after 1 s."""

    answered = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).answered += 1
        if type(self).answered > 1:
            time.sleep(1.0)
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"predictions": []}')
        except OSError:  # the client gave up
            pass

    def log_message(self, *args: object) -> None:
        pass


def test_request_timeout_from_the_spec_is_enforced_and_counted(servinglab_cmd: list[str], tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowAfterFirst)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    experiment = manifests.experiment(
        "slow", load={"concurrency": [2], "warmupSeconds": 0, "durationSeconds": 2, "requestTimeoutSeconds": 0.3}
    )
    spec_file = tmp_path / "experiment.yaml"
    spec_file.write_text(yaml.safe_dump(experiment))
    try:
        run = subprocess.run(
            [*servinglab_cmd, "loadtest", "--target", f"http://127.0.0.1:{server.server_address[1]}",
             "--model", "tiny", "--spec-file", str(spec_file), "--termination-log", str(tmp_path / "t")],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert run.returncode == 0, run.stderr[-2000:]
    (level,) = json.loads(run.stdout)["results"]
    assert level["errors"] > 0
    assert level["errorsByKind"].get("timeout") == level["errors"], level["errorsByKind"]
    assert level["throughputRps"] == 0.0
