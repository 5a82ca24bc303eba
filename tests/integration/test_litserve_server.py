"""A real LitServe (servinglab's LitAPI, the rendered script, this venv's litserve) with the tiny model: the
requested settings are the ones its workers report, batches form, a model that cannot load ends the
server at once with its reason, and `servinglab run` / `servinglab sweep` measure it like TorchServe —
a sweep restarting it per configuration and comparing it with TorchServe on a `kind` axis."""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from servinglab import servers
from servinglab.api import ExperimentSpec, PayloadFormat
from servinglab.loadgen.payloads import make_payloads
from servinglab.servers.base import ServerError
from support import manifests
from support.serving import ready_server

ROOT = Path(__file__).resolve().parents[2]
LITSERVE = servers.get("litserve")


def experiment_spec(**server: Any) -> ExperimentSpec:
    return ExperimentSpec.model_validate({
        "model": {"name": "tiny"},
        "server": {"kind": "litserve", "gpus": 0, **server},
        "load": {"concurrency": [16]},
    })  # fmt: skip


def sessions_under(watchdog: int) -> set[int]:
    """The sessions of a running server: its watchdog's and the server's own (the watchdog's child)."""
    return {watchdog, *(child.pid for child in psutil.Process(watchdog).children())}


def session_of(sessions: set[int]) -> list[psutil.Process]:
    """The processes still in those sessions (the watchdog, LitServe's API processes, workers, manager)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) in sessions:
                found.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def test_the_workers_report_the_requested_settings_batches_form_and_nothing_outlives_the_server(
    tmp_path: Path,
) -> None:
    spec = experiment_spec(batchSize=4, maxBatchDelayMs=300, workers=2)
    served = LITSERVE.prepare_model(spec, tmp_path)
    serving = ready_server(lambda: LITSERVE.local("tiny", served.directory, spec, tmp_path, reuse=False), 180)
    with serving as (server, cold_start):
        assert cold_start > 0 and server.process is not None
        pid = server.process.pid
        sessions = sessions_under(pid)
        assert len(sessions) == 2, "the watchdog's session and LitServe's"
        effective = server.effective()
        assert (effective.batch_size, effective.max_batch_delay_ms, effective.ready_workers) == (4, 300, 2)
        metrics = LITSERVE.metrics("tiny")
        body = make_payloads(PayloadFormat.PNG, 32, 1, seed=0)[0]
        before = metrics.snapshot(server.metrics_text())
        # 16 simultaneous requests, 2 workers, batch 4, 300 ms timeout: batches must fill up
        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(lambda _: server.predict(body, "image/png"), range(16)))
        after = metrics.snapshot(server.metrics_text())
        code, refused = server.predict(b"\x00" * 100, "application/octet-stream")
        notes = server.notes()
    assert all(code == 200 and len(answer["predictions"]) == 5 for code, answer in answers)
    breakdown = metrics.breakdown(before, after)
    assert breakdown.server_requests == 16 and breakdown.batches is not None
    assert breakdown.mean_batch_size is not None and breakdown.mean_batch_size > 1.5
    assert breakdown.queue_ms_mean is not None and breakdown.inference_ms_per_batch is not None
    assert code == 400 and "neither JPEG, PNG" in refused["error"], "one bad body is refused alone"
    assert notes.precision_note == "fp32 runs natively on CPU" and notes.warmup is not None
    deadline = time.monotonic() + 10
    while (left := session_of(sessions)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"LitServe processes left behind: {[p.pid for p in left]}"


def test_a_model_that_cannot_load_ends_the_server_at_once_with_its_reason(
    tmp_path: Path, no_leftover_servers: float
) -> None:
    spec = experiment_spec(batchSize=2, workers=2)
    served = LITSERVE.prepare_model(spec, tmp_path)
    weights = served.directory / "weights.pt"
    weights.unlink()  # a link to the shared build: replaced, not written through
    weights.write_bytes(b"not a state dict")
    server = LITSERVE.local("tiny", served.directory, spec, tmp_path, reuse=False)
    server.start()
    assert server.process is not None
    started = time.monotonic()
    with pytest.raises(ServerError) as raised:
        server.wait_ready(600)
    message = str(raised.value)
    assert message.startswith("ModelLoadFailed: LitServe's worker on cpu could not load tiny: "), message
    assert "UnpicklingError" in message or "weights" in message, message
    assert time.monotonic() - started < 120, "a broken model must not wait out the start-up timeout"
    assert server.process is None  # and `no_leftover_servers` finds none of its processes left


def sweep_document(tmp_path: Path) -> Path:
    """Two servers, two batch sizes each, an SLO loose enough for a loaded 2-core machine."""
    document = manifests.sweep(
        "tiny-kinds",
        template={
            "model": {"name": "tiny"},
            "server": {"gpus": 0, "maxBatchDelayMs": 5, "warmupSeconds": 5},
            "load": {"concurrency": [8], "warmupSeconds": 0.5, "durationSeconds": 2, "payload": {"format": "jpeg"}},
            "slo": {"p99LatencyMs": 5000},
            "ceiling": {"enabled": False},
        },
        strategy="grid",
        space={"kind": {"values": ["torchserve", "litserve"]}, "batchSize": {"values": [1, 8]}},
    )  # fmt: skip
    path = tmp_path / "kinds.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.mark.torchserve
@pytest.mark.slow
def test_one_sweep_compares_torchserve_and_litserve_each_reconfigured_its_own_way(
    servinglab_cmd: list[str], tmp_path: Path, no_leftover_servers: float
) -> None:
    output = tmp_path / "out"
    run = subprocess.run(
        [*servinglab_cmd, "sweep", str(sweep_document(tmp_path)), "--output", str(output)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    document = json.loads((output / "sweep.json").read_text())
    trials = {t["name"].removeprefix("tiny-kinds-"): t for t in document["trials"]}
    assert list(trials) == ["torchserve-b1-d5-w1-fp32", "torchserve-b8-d5-w1-fp32", "litserve-b1-d5-w1-fp32",
                            "litserve-b8-d5-w1-fp32"]  # fmt: skip
    assert all(t["state"] == "Succeeded" and t["capacityRps"] for t in trials.values()), trials
    # TorchServe takes the new batch size in place; LitServe (no management API) is restarted with it
    assert trials["torchserve-b8-d5-w1-fp32"]["reconfigured"] is True
    assert trials["litserve-b8-d5-w1-fp32"]["reconfigured"] is False
    for name in trials:
        results = json.loads((output / "trials" / f"tiny-kinds-{name}.json").read_text())["results"]
        server = results["server"]
        assert server["kind"] == name.split("-")[0]
        if server["kind"] == "litserve":  # verified against the workers' own report before the load
            assert server["effective"] == {"batchSize": server["batchSize"], "maxBatchDelayMs": 5, "readyWorkers": 1}
            assert results["coldStartSeconds"] > 0, "a restart is the trial's cold start"
        assert results["results"][0]["server"]["meanBatchSize"] >= 1
    bests = document["bestPerKind"]
    assert {b["config"]["kind"] for b in bests} == {"torchserve", "litserve"}
    assert bests[0]["capacityRps"] >= bests[1]["capacityRps"]
    # the winner is named after the confirmation runs of the best trials of any server (which may reorder
    # them; with a tie, the cheapest of the tied is named)
    candidates = {c["trial"] for c in document["confirmation"]["candidates"]}
    assert document["best"]["trial"] in candidates and document["best"]["confidence"] in ("Confirmed", "Tie")
    assert bests[0]["trial"] in candidates  # the highest single measurement is re-measured
    assert "server" in run.stdout and "best on torchserve" in run.stdout and "best on litserve" in run.stdout
    exported = {path.name for path in (output / "best").iterdir()}
    own = {"litserve": {"server.py"}, "torchserve": {"config.properties", "model-config.yaml"}}
    assert own[document["best"]["config"]["kind"]] <= exported, exported
