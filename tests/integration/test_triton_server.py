"""A real tritonserver configured from the spec: an experiment end to end through `servinglab run`, the
settings Triton reports are the requested ones and batches really form, a model Triton cannot load ends
the start with Triton's reason, a sweep's trials reconfigure one server through the repository API, which
refuses anyone without the runner's key, and a configuration changed behind the runner's back is caught
before any load, locally and by the load Job's program."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from servinglab.api import ExperimentSpec, PayloadFormat, ServerSpec
from servinglab.loadgen.payloads import make_payloads
from servinglab.servers import get
from servinglab.servers.base import ServerError
from servinglab.servers.counters import Snapshot
from servinglab.servers.triton import metrics as triton_metrics
from servinglab.servers.triton.env import TritonEnv
from servinglab.servers.triton.local import LocalTriton
from support.serving import ready_server

pytestmark = pytest.mark.triton

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def tiny_entry(tmp_path_factory: pytest.TempPathFactory, triton_env: TritonEnv) -> Path:
    """The tiny model laid out as a Triton repository entry, as the local runner prepares it."""
    spec = ExperimentSpec.model_validate({"model": {"name": "tiny"}, "server": {"kind": "triton"}})
    return get("triton").prepare_model(spec, tmp_path_factory.mktemp("triton-model")).directory


def serve(entry: Path, workdir: Path, **settings: Any) -> LocalTriton:
    return LocalTriton("tiny", entry, ServerSpec.model_validate({"kind": "triton", "gpus": 0, **settings}), workdir)


def counted(server: LocalTriton, before: Snapshot, requests: int) -> Snapshot:
    """Triton's metrics once they count `requests` since `before` (or after 10 s, as they are): Triton
    records a batch's statistics after the model's execute returns, so a client can hold every answer a
    moment before the last batch is counted (CI read 12 of 16, one batch of 4 short)."""
    deadline = time.monotonic() + 10
    while True:
        after = triton_metrics.parse(server.metrics_text(), "tiny")
        if (triton_metrics.breakdown(before, after).server_requests or 0) >= requests or time.monotonic() > deadline:
            return after
        time.sleep(0.2)


def experiment(tmp_path: Path, name: str, server: dict[str, Any], concurrency: list[int]) -> Path:
    document = yaml.safe_load((EXAMPLES / "experiment-smoke.yaml").read_text())
    document["metadata"]["name"] = name
    document["spec"]["server"].update(kind="triton", **server)
    document["spec"]["load"].update(concurrency=concurrency, warmupSeconds=0.5, durationSeconds=2)
    document["spec"]["ceiling"] = {"enabled": False}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_an_experiment_on_triton_reports_every_level_with_triton_s_breakdown(
    servinglab_cmd: list[str], triton_env: TritonEnv, tmp_path: Path, no_leftover_servers: float
) -> None:
    path = experiment(tmp_path, "tiny-triton", {"batchSize": 8, "maxBatchDelayMs": 20, "workers": 2}, [1, 16])
    run = subprocess.run([*servinglab_cmd, "run", str(path), "--output", str(tmp_path / "out.json")],
                         capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    effective = results["server"]["effective"]
    assert (effective["batchSize"], effective["maxBatchDelayMs"], effective["readyWorkers"]) == (8, 20, 2)
    assert results["server"]["kind"] == "triton"
    assert results["runtime"]["precisionNote"].startswith("fp32")
    assert results["runtime"]["warmup"]["batchSizes"] == [1, 2, 4, 8]
    levels = {level["concurrency"]: level for level in results["results"]}
    assert set(levels) == {1, 16}
    for level in levels.values():
        assert level["errors"] == 0 and level["requests"] > 0
        # Triton counted what the generator sent in the window (up to the requests in flight at the window's two
        # edges and those answered while its metrics were read: CI saw 502 against 484 at 16 users), and says
        # where the time went
        served, edges = level["server"]["serverRequests"], 2 * level["concurrency"]
        assert abs(served - level["requests"]) <= edges + 0.25 * level["throughputRps"], (served, level["requests"])
        assert 0 < level["server"]["inferenceMsPerBatch"] < level["latencyMs"]["max"]
    assert levels[1]["server"]["meanBatchSize"] == pytest.approx(1.0)
    assert levels[16]["server"]["meanBatchSize"] > 2


def test_triton_applies_the_requested_settings_and_forms_batches(
    tiny_entry: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    settings = {"batchSize": 4, "maxBatchDelayMs": 300, "workers": 2, "precision": "bf16"}
    with ready_server(lambda: serve(tiny_entry, tmp_path, **settings), 120) as (server, cold_start):
        assert cold_start > 0
        applied = server.applied()
        assert (applied.max_batch_size, applied.max_queue_delay_us, applied.instances) == (4, 300_000, 2)
        assert applied.kinds == ("KIND_CPU",) and applied.parameters["precision"] == "bf16"
        effective = server.effective()
        assert (effective.batch_size, effective.max_batch_delay_ms, effective.ready_workers) == (4, 300, 2)

        body = make_payloads(PayloadFormat.PNG, 32, 1, seed=0)[0]
        before = triton_metrics.parse(server.metrics_text(), "tiny")
        # 16 simultaneous requests, 2 instances, batch 4, 300 ms delay: batches must fill up
        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(lambda _: server.predict(body, "image/png"), range(16)))
        after = counted(server, before, 16)
        code, refused = server.predict(b"\x00" * 100, "application/octet-stream")
        notes = server.notes()
    assert all(code == 200 for code, _ in answers), answers[0]
    outputs = {output["name"]: output for output in answers[0][1]["outputs"]}
    assert outputs["CLASSES"]["shape"] == [1, 5] and outputs["PROBABILITIES"]["datatype"] == "FP32"
    breakdown = triton_metrics.breakdown(before, after)
    assert breakdown.server_requests == 16
    assert breakdown.mean_batch_size is not None and breakdown.mean_batch_size > 1.5
    assert code == 400 and "neither JPEG, PNG" in refused["error"]  # one bad image, its own error
    assert notes.precision_note is not None and notes.precision_note.startswith("bf16")


def test_a_model_triton_cannot_load_ends_the_start_with_triton_s_reason(
    tiny_entry: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_entry, broken, symlinks=True)
    weights = broken / "1" / "build" / "weights.pt"
    weights.unlink()
    weights.write_bytes(b"not a state dict")
    started = time.monotonic()
    with pytest.raises(ServerError) as failed, ready_server(lambda: serve(broken, tmp_path / "work"), 300):
        pass  # never reached: the start fails (on other ports if one picked was taken)
    message = str(failed.value)
    assert message.startswith("ModelLoadFailed: Triton could not load tiny:")
    assert "weights.pt" in message or "pickle" in message.lower() or "zip" in message.lower(), message
    assert time.monotonic() - started < 120  # told at once, not after the start-up timeout


def test_a_sweep_reconfigures_one_triton_through_the_repository_api(
    servinglab_cmd: list[str], triton_env: TritonEnv, tmp_path: Path, no_leftover_servers: float
) -> None:
    document = yaml.safe_load((EXAMPLES / "sweep-smoke.yaml").read_text())
    document["metadata"]["name"] = "tiny-triton"
    template = document["spec"]["template"]
    template["server"]["kind"] = "triton"
    template["load"].update(warmupSeconds=0.5, durationSeconds=2)
    template["ceiling"] = {"enabled": False}
    configs = [{"batchSize": 1, "maxBatchDelayMs": 1, "workers": 1, "precision": "fp32"},
               {"batchSize": 8, "maxBatchDelayMs": 10, "workers": 1, "precision": "fp32"},
               {"batchSize": 8, "maxBatchDelayMs": 10, "workers": 2, "precision": "bf16"}]  # fmt: skip
    document["spec"].update(strategy="list", configurations=configs, space={})
    document["spec"].pop("stop", None)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(document))
    run = subprocess.run([*servinglab_cmd, "sweep", str(path), "--output", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    trials = sorted(
        (json.loads(p.read_text()) for p in (tmp_path / "out" / "trials").glob("*.json")), key=lambda t: t["order"]
    )
    assert [t["reconfigured"] for t in trials] == [False, True, True]  # one tritonserver for the sweep
    for trial in trials:
        effective, config = trial["results"]["server"]["effective"], trial["config"]
        assert (effective["batchSize"], effective["maxBatchDelayMs"], effective["readyWorkers"]) == (
            config["batchSize"], config["maxBatchDelayMs"], config["workers"],
        )  # fmt: skip
        assert trial["results"]["runtime"]["precisionNote"].startswith(config["precision"])
    assert trials[0]["results"]["coldStartSeconds"] > 0
    assert all(t["results"]["reconfiguredSeconds"] > 0 for t in trials[1:])


def post(url: str, document: dict[str, Any]) -> int:
    """The HTTP status of a POST of `document`, as anyone who reaches the port sends it."""
    request = urllib.request.Request(url, data=json.dumps(document).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def overridden(server: LocalTriton, **changed: Any) -> dict[str, Any]:
    """A load request with the model's served configuration, `changed` (Triton then ignores config.pbtxt)."""
    served = json.loads(urllib.request.urlopen(f"{server.inference_url}/v2/models/tiny/config", timeout=30).read())
    served["dynamic_batching"].pop("preferred_batch_size", None)  # Triton derived it from max_batch_size
    return {"parameters": {"config": json.dumps(served | changed)}}


def test_a_load_without_the_runner_s_key_is_refused_and_the_served_configuration_stays(
    tiny_entry: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    """Every local user reaches the loopback port: without the runner's key the repository API neither loads
    another configuration (or model.py) nor unloads the model; the runner's own reconfiguration still loads."""
    settings = {"batchSize": 4, "maxBatchDelayMs": 5, "workers": 1}
    with ready_server(lambda: serve(tiny_entry, tmp_path, **settings), 120) as (server, _):
        repository = f"{server.inference_url}/v2/repository"
        assert post(f"{repository}/models/tiny/load", overridden(server, max_batch_size=2)) == 403
        assert post(f"{repository}/models/tiny/unload", {}) == 403
        assert server.applied().max_batch_size == 4 and server.model_state() == ("READY", "")
        assert server.reconfigure(ServerSpec.model_validate({"kind": "triton", "gpus": 0, "batchSize": 8})) > 0
        assert server.effective().batch_size == 8
        key = server._repository_key
    assert len(key) >= 32 and key not in (tmp_path / "tritonserver.log").read_text()


def test_a_configuration_changed_behind_the_runner_s_back_is_caught_before_any_load(
    servinglab_cmd: list[str], tiny_entry: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    spec_file = experiment(tmp_path, "changed", {"batchSize": 4, "maxBatchDelayMs": 5, "workers": 1}, [4])
    settings = {"batchSize": 4, "maxBatchDelayMs": 5, "workers": 1}
    with ready_server(lambda: serve(tiny_entry, tmp_path / "server", **settings), 120) as (server, _):
        # a load with another batch size by whoever holds the key (here the runner's own request)
        server._http("/v2/repository/models/tiny/load", 120, json.dumps(overridden(server, max_batch_size=2)).encode())
        with pytest.raises(ServerError) as local:
            server.effective()  # what the local runner checks before it measures
        run = subprocess.run(
            [*servinglab_cmd, "loadtest", "--target", server.inference_url, "--model", "tiny", "--spec-file",
             str(spec_file), "--output", str(tmp_path / "out.json"), "--termination-log", str(tmp_path / "ended")],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        served = triton_metrics.parse(server.metrics_text(), "tiny")
    assert "max_batch_size is 2, the spec's is 4" in str(local.value)
    assert run.returncode == 8, run.stderr[-3000:]  # ExitCode.SETTINGS_NOT_APPLIED
    message = (tmp_path / "ended").read_text()
    assert message.startswith("Triton serves tiny with another configuration") and "max_batch_size is 2" in message
    assert "parameters" not in message and not (tmp_path / "out.json").exists()
    assert served.get("nv_inference_request_success", 0) < 10  # the load Job's test request(s), no level
