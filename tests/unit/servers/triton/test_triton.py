"""Triton's pure parts: config.pbtxt from the spec, the configuration Triton reports read back, its metrics
as the breakdown, the KServe v2 encoding the load generator sends, the pod, and the launcher's reason."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from servinglab.api import (
    ExperimentSpec,
    LoadSpec,
    PayloadFormat,
    RequestProtocol,
    ResponseCheck,
    ServerSpec,
    load_sweep,
    trial_spec,
)
from servinglab.loadgen.payloads import CONTENT_TYPES, Payload, make_payloads
from servinglab.loadgen.protocol import HEADER_LENGTH, answer_problem, encode
from servinglab.servers import get
from servinglab.servers.base import PodInputs
from servinglab.servers.triton import config, metrics, pod
from support.paths import EXAMPLES

# As tritonserver 2.51 prints them (one model, one version; the failure counter per reason).
SCRAPE = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="m",version="1"}} {requests}
nv_inference_request_success{{model="other",version="1"}} 999
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{{model="m",reason="OTHER",version="1"}} 0
nv_inference_request_failure{{model="m",reason="BACKEND",version="1"}} 0
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{{model="m",version="1"}} {requests}
# HELP nv_inference_exec_count Number of model executions performed (does not include cached requests)
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{{model="m",version="1"}} {executions}
# HELP nv_inference_request_duration_us Cumulative inference request duration in microseconds
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{{model="m",version="1"}} {request_us}
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="m",version="1"}} {queue_us}
# HELP nv_inference_compute_input_duration_us Cumulative compute input duration in microseconds
# TYPE nv_inference_compute_input_duration_us counter
nv_inference_compute_input_duration_us{{model="m",version="1"}} 974
# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in microseconds
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{{model="m",version="1"}} {infer_us}
# HELP nv_inference_compute_output_duration_us Cumulative inference compute output duration in microseconds
# TYPE nv_inference_compute_output_duration_us counter
nv_inference_compute_output_duration_us{{model="m",version="1"}} 34157
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="m",version="1"}} 0
"""


def scrape(**values: float) -> metrics.Snapshot:
    return metrics.parse(SCRAPE.format(**values), "m")


def test_the_breakdown_is_the_window_s_difference_of_triton_s_counters() -> None:
    before = scrape(requests=9, executions=3, request_us=2_007_513, queue_us=994_396, infer_us=977_897)
    after = scrape(requests=109, executions=28, request_us=4_007_513, queue_us=1_494_396, infer_us=2_977_897)
    assert before["nv_inference_request_success"] == 9  # the other model's series is not counted
    breakdown = metrics.breakdown(before, after)
    assert breakdown.server_requests == 100 and breakdown.batches == 25
    assert breakdown.mean_batch_size == 4.0
    assert breakdown.queue_ms_mean == 5.0 and breakdown.server_latency_ms_mean == 20.0
    assert breakdown.inference_ms_per_batch == 20.0
    assert breakdown.preprocess_ms_per_batch == 0.0  # unchanged counters: nothing spent in the window


def test_a_window_without_requests_has_no_means() -> None:
    same = scrape(requests=9, executions=3, request_us=1, queue_us=1, infer_us=1)
    breakdown = metrics.breakdown(same, same)
    assert breakdown.queue_ms_mean is None and breakdown.mean_batch_size is None and breakdown.server_requests == 0


def test_config_pbtxt_maps_batch_delay_instances_and_precision() -> None:
    server = ServerSpec(kind="triton", batch_size=16, max_batch_delay_ms=5, workers=3, precision="fp16", gpus=2)
    text = config.render_config("resnet50", server, gpus=2, load=LoadSpec(concurrency=[4, 8]))
    assert 'name: "resnet50"' in text and 'backend: "python"' in text
    assert "max_batch_size: 16\n" in text
    assert "dynamic_batching { max_queue_delay_microseconds: 5000 }" in text
    # three copies in all, spread over the two GPUs (Triton's count is per GPU listed)
    assert "instance_group [{ count: 2, kind: KIND_GPU, gpus: [0] }, { count: 1, kind: KIND_GPU, gpus: [1] }]" in text
    assert 'key: "precision", value: { string_value: "fp16" }' in text
    # the closed loop never has more than 8 requests out: larger batches are not warmed up
    assert 'key: "warmup_batch_sizes", value: { string_value: "1,2,4,8" }' in text
    on_cpu = config.render_config("tiny", ServerSpec(kind="triton", workers=2), gpus=0)
    assert "instance_group [{ count: 2, kind: KIND_CPU }]" in on_cpu


def test_what_triton_reports_is_read_back_as_the_effective_settings() -> None:
    reported = {  # GET /v2/models/m/config, as tritonserver 2.51 answers (64-bit integers as strings)
        "name": "m", "max_batch_size": 4,
        "dynamic_batching": {"max_queue_delay_microseconds": "300000", "preserve_ordering": False},
        "instance_group": [{"name": "m_0", "kind": "KIND_CPU", "count": 2, "gpus": []}],
        "parameters": {"precision": {"string_value": "bf16"}},
    }  # fmt: skip
    applied = config.read_applied(reported)
    assert (applied.max_batch_size, applied.max_queue_delay_us, applied.instances) == (4, 300_000, 2)
    effective = applied.effective(ready_instances=2)
    assert (effective.batch_size, effective.max_batch_delay_ms, effective.ready_workers) == (4, 300, 2)
    assert config.read_applied({"max_batch_size": 0}).effective(0).max_batch_delay_ms is None


def served(spec: ExperimentSpec, parameters: dict[str, str] | None = None, **changed: object) -> dict[str, object]:
    """GET /v2/models/tiny/config as Triton answers when it serves the pod's config.pbtxt, but for `changed` and
    `parameters` (as a GPU-less node runs it: its instances on the CPU)."""
    wanted = config.expected(spec.server, spec.server.gpus, spec.load)
    values = wanted.parameters | (parameters or {})
    return {
        "name": "tiny", "backend": "python", "max_batch_size": wanted.max_batch_size,
        "dynamic_batching": {"max_queue_delay_microseconds": str(wanted.max_queue_delay_us)},
        "instance_group": [{"name": "tiny_0", "kind": "KIND_CPU", "count": wanted.instances}],
        "parameters": {key: {"string_value": value} for key, value in values.items()},
    } | changed  # fmt: skip


def test_the_load_job_reads_what_triton_serves_and_names_each_field_that_differs() -> None:
    spec = ExperimentSpec.model_validate(
        {"model": {"name": "tiny"}, "server": {"kind": "triton", "gpus": 1, "batchSize": 4, "workers": 2}}
    )
    triton = get("triton")

    def answering(document: dict[str, object]) -> Callable[[str], bytes]:
        paths = {"/v2/models/tiny/config": json.dumps(document).encode(), "/v2/models/tiny/ready": b""}
        return lambda path: paths[path]

    effective, differs = triton.applied_settings(spec, "tiny", answering(served(spec)))
    assert differs is None and effective is not None  # GPU instances on a GPU-less node's CPU are still them
    assert (effective.batch_size, effective.ready_workers) == (4, 2)
    # reloaded behind the operator's back: another batch size and precision, one instance
    changed = served(spec, {"precision": "fp16"}, max_batch_size=16, instance_group=[{"kind": "KIND_GPU", "count": 1}])
    _, differs = triton.applied_settings(spec, "tiny", answering(changed))
    assert differs is not None and differs.startswith("Triton serves tiny with another configuration")
    assert "max_batch_size is 16, the spec's is 4" in differs
    assert "instance_group count is 1, the spec's is 2" in differs
    assert "parameters.precision is 'fp16', the spec's is 'fp32'" in differs
    # another backend than servinglab's model (a native one) is named too, and what served is reported
    assert effective.backend == "python"
    _, differs = triton.applied_settings(spec, "tiny", answering(served(spec, backend="onnxruntime")))
    assert differs is not None and "backend is 'onnxruntime', the spec's is 'python'" in differs
    # TorchServe and LitServe say nothing on their inference port
    assert get("torchserve").applied_settings(spec, "tiny", answering(changed)) == (None, None)


def test_triton_s_requests_are_kserve_v2_with_the_body_as_a_binary_element() -> None:
    body = make_payloads(PayloadFormat.JPEG, 32, 1, seed=1)[0]
    protocol = get("triton").request_protocol("tiny")
    request = encode(protocol, Payload(body, "image/jpeg"))
    length = int(request.headers[HEADER_LENGTH])
    header = json.loads(request.body[:length])
    (tensor,) = header["inputs"]
    assert (tensor["name"], tensor["datatype"], tensor["shape"]) == ("INPUT", "BYTES", [1, 1])
    element = request.body[length:]
    assert tensor["parameters"]["binary_data_size"] == len(element) == len(body) + 4
    assert int.from_bytes(element[:4], "little") == len(body) and element[4:] == body
    assert get("triton").request_path("tiny") == "/v2/models/tiny/infer"


def test_torchserve_s_requests_are_the_body_as_it_is() -> None:
    body = make_payloads(PayloadFormat.RAW, 8, 1, seed=1)[0]
    request = encode(get("torchserve").request_protocol("m"), Payload(body, CONTENT_TYPES[PayloadFormat.RAW]))
    assert request.body == body and request.headers == {"Content-Type": "application/x-npy"}


def test_a_kserve_v2_answer_without_outputs_fails_the_json_check() -> None:
    protocol, check = get("triton").request_protocol("m"), ResponseCheck(json_body=True)
    answer = b'{"model_name":"m","outputs":[{"name":"CLASSES","datatype":"INT64","shape":[1,5],"data":[1,2,3,4,5]}]}'
    assert answer_problem(protocol, 200, answer, check) is None
    assert answer_problem(protocol, 200, b'{"model_name":"m","outputs":[]}', check) == "no_outputs"
    assert answer_problem(protocol, 200, b"\x00garbage", check) == "malformed_json"
    assert answer_problem(RequestProtocol(), 200, b'{"predictions":[]}', check) is None


def test_the_triton_pod_is_restricted_ready_on_triton_s_own_word_and_bounded() -> None:
    spec = ExperimentSpec.model_validate({"model": {"name": "resnet50"}, "server": {"kind": "triton", "gpus": 1}})
    inputs = PodInputs(config_map="cm", servinglab_image="docker.io/servinglab/servinglab:0.1.0")
    plan = get("triton").pod(spec, inputs)
    (container,) = plan.containers
    assert container["image"] == "docker.io/servinglab/triton:0.1.0"
    assert container["securityContext"]["readOnlyRootFilesystem"] and container["securityContext"]["runAsNonRoot"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/models/resnet50/ready", "port": "inference"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"inference": 8000, "metrics": 8002}
    assert "--allow-grpc=false" in container["args"]
    # the repository API is on the inference port the Service exposes: a pod's Triton takes no loads through it
    assert "--model-control-mode=none" in container["args"]
    assert not [arg for arg in container["args"] if arg.startswith(("--model-control-mode=explicit", "--load-model"))]
    assert all("sizeLimit" in v["emptyDir"] for v in plan.volumes if "emptyDir" in v)
    assert "kind: KIND_GPU, gpus: [0]" in plan.config_files["config.pbtxt"]
    (init,) = plan.init_containers
    assert "--into /models/resnet50 --server triton" in init["args"][0]
    assert get("triton").start_failure("ModelLoadFailed: Triton could not load resnet50: boom") == (
        "ModelLoadFailed", "Triton could not load resnet50: boom",
    )  # fmt: skip
    assert get("triton").start_failure("Error: something else") is None


def test_the_launcher_ends_a_failed_load_with_triton_s_reason(tmp_path: Path) -> None:
    fake = tmp_path / "tritonserver"  # prints what tritonserver 2.51 logs when model.py raises, and gives up
    fake.write_text(
        "#!/bin/sh\n"
        "echo 'I1123 model_lifecycle.cc:472] \"loading: m:1\"'\n"
        "echo 'E1123 model_lifecycle.cc:642] \"failed to load '\"'\"'m'\"'\"' version 1: Internal: "
        "RuntimeError: bad weights\\\\n\\\\nAt:\\\\n  /models/m/1/model.py(60): initialize\\\\n\"'\n"
        "echo 'error: creating server: Internal - failed to load all models'\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    log, termination = tmp_path / "log", tmp_path / "termination"
    script = pod.server_launcher("m", str(log), str(termination))
    run = subprocess.run(
        ["sh", "-c", script, str(fake), "--x"], capture_output=True, text=True, timeout=30, check=False
    )
    assert run.returncode == 1 and "failed to load all models" in run.stdout  # Triton's output still shown
    assert termination.read_text() == "ModelLoadFailed: Triton could not load m: Internal: RuntimeError: bad weights"


def test_the_seed_002_example_replays_the_tutorial_s_three_steps() -> None:
    sweep = load_sweep(EXAMPLES / "sweep-triton-seed002.yaml")
    specs = [trial_spec(sweep.spec, trial) for trial in sweep.spec.configurations]
    assert all(spec.server.kind == "triton" for spec in specs)
    assert specs[0].load.concurrency == list(range(2, 17, 2))  # perf_analyzer's --concurrency-range 2:16:2
    configs = [config.render_config("resnet50", spec.server, gpus=1) for spec in specs]
    assert "max_batch_size: 1\n" in configs[0] and "count: 1, kind: KIND_GPU" in configs[0]  # no batching
    assert "max_batch_size: 8\n" in configs[1] and "count: 1, kind: KIND_GPU" in configs[1]  # dynamic batching
    assert "max_batch_size: 8\n" in configs[2] and "count: 2, kind: KIND_GPU" in configs[2]  # two instances
