"""LitServe behind the seam, without a server: the script's knobs, the pod, the counters' breakdown, the
model folder and what a failed start says (pure functions; the real server is in tests/integration)."""

from __future__ import annotations

import ast
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from servinglab import servers
from servinglab.api import ExperimentSpec
from servinglab.servers.base import PodInputs, not_applied, reported
from servinglab.servers.litserve import config, layout, metrics
from support.paths import ROOT


def spec(**server: Any) -> ExperimentSpec:
    return ExperimentSpec.model_validate({
        "model": {"name": "resnet50"},
        "server": {"kind": "litserve", "batchSize": 32, "maxBatchDelayMs": 25, "workers": 4, "precision": "fp16",
                   "gpus": 0, **server},
        "load": {"concurrency": [1, 8]},
    })  # fmt: skip


def calls(script: str) -> dict[str, dict[str, Any]]:
    """The keyword arguments of each call the script makes, by the called name (literals only)."""
    found: dict[str, dict[str, Any]] = {}
    for node in ast.walk(ast.parse(script)):
        if isinstance(node, ast.Call):
            arguments = found.setdefault(ast.unparse(node.func), {})
            for keyword in node.keywords:
                try:
                    arguments[str(keyword.arg)] = ast.literal_eval(keyword.value)
                except ValueError:
                    continue  # a name, not a literal
    return found


def test_the_script_maps_each_axis_onto_litservers_own_knob() -> None:
    made = calls(config.render_script(spec(responseTimeoutSeconds=90), 0, "/models/resnet50"))
    api, server = made["ServinglabAPI"], made["ls.LitServer"]
    assert (api["max_batch_size"], api["batch_timeout"]) == (32, 0.025)
    assert (server["accelerator"], server["devices"], server["workers_per_device"]) == ("cpu", 1, 4)
    assert server["timeout"] == 90
    # the handler's settings are every server's: warm-up only up to what 8 users can form
    assert api["handler"] == {"precision": "fp16", "warmupBatchSizes": [1, 2, 4, 8], "warmupSeconds": 60.0, "topK": 5,
                              "dataPath": spec().server.data_path.handler_settings()}  # fmt: skip


@pytest.mark.parametrize(("gpus", "workers", "devices", "per_device"), [(1, 3, 1, 3), (2, 4, 2, 2), (2, 3, 1, 3)])
def test_workers_divide_among_the_gpus_they_can(gpus: int, workers: int, devices: int, per_device: int) -> None:
    server = calls(config.render_script(spec(gpus=gpus, workers=workers), gpus, "/m"))["ls.LitServer"]
    assert (server["accelerator"], server["devices"], server["workers_per_device"]) == ("cuda", devices, per_device)


def test_the_pod_is_ready_when_litserve_says_every_worker_is_set_up_and_runs_restricted() -> None:
    experiment = spec()
    plan = servers.get("litserve").pod(experiment, PodInputs("cm", "servinglab/servinglab:0.1.0"))
    (container,) = plan.containers
    assert container["image"] == "servinglab/litserve:0.1.0"
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "inference"}
    assert container["livenessProbe"]["tcpSocket"] == {"port": "metrics"}, "the inference port opens late"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"inference": 8000, "metrics": 8002}
    for part in [*plan.init_containers, container]:
        context = part["securityContext"]
        assert context["runAsNonRoot"] and context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
        assert context["capabilities"] == {"drop": ["ALL"]}
    assert "--server litserve" in plan.init_containers[0]["args"][0]
    assert plan.run_as_user != 0 and plan.metrics_port == 8002 and plan.metrics_path == "/metrics"
    assert set(plan.config_files) == {"server.py"}
    compile(plan.config_files["server.py"], "server.py", "exec")
    assert "'/models/resnet50'" in plan.config_files["server.py"]


def test_a_failed_start_is_read_from_the_termination_message() -> None:
    litserve = servers.get("litserve")
    said = "ModelLoadFailed: LitServe's worker on cpu could not load tiny: RuntimeError: weights missing"
    assert litserve.start_failure(said) == (
        "ModelLoadFailed",
        "LitServe's worker on cpu could not load tiny: RuntimeError: weights missing",
    )
    assert litserve.start_failure("Error: something else") is None


COUNTERS = """\
# TYPE servinglab_litserve_batches_total counter
servinglab_litserve_batches_total {batches}
servinglab_litserve_batched_requests_total {batched}
servinglab_litserve_queue_ms_total {queue}
servinglab_litserve_preprocess_ms_total {pre}
servinglab_litserve_inference_ms_total {infer}
servinglab_litserve_postprocess_ms_total 4.0
# TYPE servinglab_litserve_requests_total counter
servinglab_litserve_requests_total{{code="2xx"}} {ok}
servinglab_litserve_requests_total{{code="4xx"}} 2.0
servinglab_litserve_request_ms_total {server}
# TYPE servinglab_litserve_max_batch_size gauge
servinglab_litserve_max_batch_size 8.0
# TYPE servinglab_litserve_batch_timeout_ms gauge
servinglab_litserve_batch_timeout_ms 5.0
# TYPE servinglab_litserve_worker_ready gauge
servinglab_litserve_worker_ready 2.0
"""


def test_the_breakdown_is_the_difference_of_two_scrapes_and_the_workers_say_their_settings() -> None:
    before = metrics.parse(COUNTERS.format(batches=10, batched=40, queue=400, pre=50, infer=100, ok=38, server=900))
    after = metrics.parse(COUNTERS.format(batches=30, batched=200, queue=2000, pre=250, infer=700, ok=198,
                                          server=4900))  # fmt: skip
    found = metrics.breakdown(before, after)
    assert (found.batches, found.mean_batch_size, found.server_requests) == (20, 8.0, 160)
    assert (found.queue_ms_mean, found.server_latency_ms_mean) == (10.0, 25.0)
    assert (found.preprocess_ms_per_batch, found.inference_ms_per_batch, found.postprocess_ms_per_batch) == (
        10.0, 30.0, 0.0)  # fmt: skip
    effective = metrics.effective(after)
    assert (effective.batch_size, effective.max_batch_delay_ms, effective.ready_workers) == (8, 5, 2)
    asked = spec(batchSize=8, maxBatchDelayMs=5, workers=2).server
    assert not_applied(asked, effective) is None
    refused = not_applied(spec(batchSize=8, maxBatchDelayMs=5, workers=4).server, effective)
    assert refused is not None and "did not apply the requested settings" in refused and "(8, 5, 4)" in refused


def test_no_worker_ready_yet_reports_no_settings_and_zero_ready() -> None:
    effective = metrics.effective(metrics.parse(""))
    assert (effective.batch_size, effective.max_batch_delay_ms, effective.ready_workers) == (None, None, 0)


def test_the_model_folder_holds_the_model_the_handler_files_and_what_to_load(tmp_path: Path) -> None:
    build = tmp_path / "build"
    build.mkdir()
    (build / "model.py").write_text("INPUT_SIZE = 32\n")
    (build / "weights.pt").write_bytes(b"weights")
    served = layout.layout_builtin(build, tmp_path / "tiny", link_weights=True)
    assert (served / "weights.pt").is_symlink() and (served / "model.py").read_text() == "INPUT_SIZE = 32\n"
    names = {path.name for path in served.iterdir()}
    assert {"servinglab_litserve_api.py", "servinglab_image_handler.py", "servinglab_imaging.py"} <= names
    assert json.loads((served / config.SERVE_FILE).read_text()) == {"serializedFile": "weights.pt",
                                                                    "modelFile": "model.py"}  # fmt: skip


def test_the_rendered_script_is_for_the_litserve_the_project_pins() -> None:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"litserve=={config.LITSERVE_VERSION}" in pins


def test_what_the_workers_report_is_checked_before_load_and_torchserve_reports_nothing() -> None:
    """What the load Job checks on the cluster before it sends load (a mismatch ends it with exit code 8)."""
    said = COUNTERS.format(batches=1, batched=1, queue=1, pre=1, infer=1, ok=1, server=1)  # batch 8, 5 ms, 2 ready
    litserve = servers.get("litserve").metrics("tiny")
    effective, differs = reported(spec(batchSize=8, maxBatchDelayMs=5, workers=2).server, litserve, said)
    assert differs is None and effective is not None and effective.ready_workers == 2
    _, differs = reported(spec(batchSize=16, maxBatchDelayMs=5, workers=2).server, litserve, said)
    assert differs is not None and "requested (16, 5, 2), in effect (8, 5, 2)" in differs
    # a server whose metrics do not say (TorchServe's) is measured as before
    assert reported(spec(batchSize=16).server, servers.get("torchserve").metrics("tiny"), said) == (None, None)
