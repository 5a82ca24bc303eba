"""LitServe in a pod: its script in the experiment's ConfigMap, the server container and its volumes (pure).

The model's init containers are every server's (:mod:`servinglab.servers.podparts`), laying the model out
for LitServe. The container runs the script with the spec's image (default: servinglab's LitServe image,
built by hack/images.sh). It is ready when LitServe's /health answers 200, which LitServe gives only once
every worker has run its setup (servinglab's LitAPI loads and warms up the model there); its liveness is
the metrics port, which opens at once (the inference port opens only when a first worker is ready, so it
cannot tell a long model load from a dead server). A worker that cannot load the model ends the container
with exit code 3 and "ModelLoadFailed: ..." as its termination message. Non-root, read-only root file
system; inference and metrics listen on all interfaces (LitServe has no management API to keep local).
"""

from __future__ import annotations

from servinglab.api import ExperimentSpec
from servinglab.servers.base import Manifest, PodInputs, PodPlan, liveness_probes, restricted, size_limit
from servinglab.servers.litserve.config import METRICS_DIR_ENV, SCRIPT, render_script
from servinglab.servers.podparts import model_init_containers, model_volumes, tmp_bytes

INFERENCE_PORT = 8000
METRICS_PORT = 8002
MODEL_STORE = "/models"
CONFIG_DIR = "/etc/litserve"
#: The user the servinglab images run as.
LITSERVE_UID = 65532


def model_dir(spec: ExperimentSpec) -> str:
    return f"{MODEL_STORE}/{spec.model.name}"


def config_files(spec: ExperimentSpec) -> dict[str, str]:
    """The script, as the pod runs it (and as an export deploys it)."""
    return {SCRIPT: render_script(spec, spec.server.gpus, model_dir(spec))}


def server_container(spec: ExperimentSpec, image: str, resources: Manifest) -> Manifest:
    return {
        "name": "litserve",
        "image": image,
        "command": ["python", f"{CONFIG_DIR}/{SCRIPT}"],
        "args": [
            "--model-dir",
            model_dir(spec),
            "--listen",
            f"0.0.0.0:{INFERENCE_PORT}",
            "--metrics-listen",
            f"0.0.0.0:{METRICS_PORT}",
            "--failure-log",
            "/dev/termination-log",
        ],
        "env": [
            {"name": METRICS_DIR_ENV, "value": "/tmp/servinglab-metrics"},
            {"name": "HOME", "value": "/tmp"},  # torch's caches; the root file system is read-only
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "ports": [
            {"name": "inference", "containerPort": INFERENCE_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "inference"},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        **liveness_probes({"tcpSocket": {"port": "metrics"}}, spec.server.startup_timeout_seconds),
        "resources": resources,
        "volumeMounts": [
            {"name": "model-store", "mountPath": MODEL_STORE, "readOnly": True},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        "securityContext": restricted(),
    }


def plan(spec: ExperimentSpec, inputs: PodInputs, image: str, resources: Manifest) -> PodPlan:
    return PodPlan(
        config_files=config_files(spec),
        config_dir=CONFIG_DIR,
        init_containers=model_init_containers(spec, inputs, MODEL_STORE, CONFIG_DIR),
        containers=[server_container(spec, image, resources)],
        volumes=[
            {"name": "config", "configMap": {"name": inputs.config_map}},
            *model_volumes(spec, inputs.model_cache_claim),
            {"name": "tmp", "emptyDir": {"sizeLimit": size_limit(tmp_bytes(spec))}},
            # the workers' queues and torch's shared tensors live in /dev/shm; the default 64 MiB is small
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        ],
        run_as_user=LITSERVE_UID,
        inference_port=INFERENCE_PORT,
        metrics_port=METRICS_PORT,
        metrics_path="/metrics",
    )
