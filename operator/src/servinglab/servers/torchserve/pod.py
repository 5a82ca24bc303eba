"""TorchServe in a pod: its files in the experiment's ConfigMap, the server container with its launcher and
readiness, and the volumes (pure). The model's init containers are every server's
(:mod:`servinglab.servers.podparts`); TorchServe's copies the rendered model-config.yaml beside the model.

The operator's builders (:mod:`servinglab.k8s.builders`) wrap this plan into the experiment's Deployment.
The TorchServe container (the spec's pinned image) serves the model store with the rendered
config.properties and never mounts the cache. Inference and metrics listen on all interfaces, management on
localhost only.
"""

from __future__ import annotations

from servinglab.api import ExperimentSpec
from servinglab.servers.base import Manifest, PodInputs, PodPlan, liveness_probes, restricted, size_limit
from servinglab.servers.podparts import model_init_containers, model_volumes, tmp_bytes
from servinglab.servers.torchserve.config import (
    Addresses,
    config_properties,
    render_metrics_config,
    render_model_config,
    render_properties,
)
from servinglab.servers.torchserve.launcher import server_launcher

INFERENCE_PORT = 8080
MANAGEMENT_PORT = 8081
METRICS_PORT = 8082
MODEL_STORE = "/home/model-server/model-store"
CONFIG_DIR = "/etc/torchserve"
#: TorchServe's log folder in the server container (an emptyDir: the root file system is read-only).
SERVER_LOGS = "/home/model-server/logs"
#: Written by the server container's launcher once every worker has loaded the model (on the /tmp emptyDir).
SERVER_READY_FILE = "/tmp/servinglab-model-loaded"
#: uid of the `model-server` user in the pytorch/torchserve images
TORCHSERVE_UID = 1000
#: TorchServe's logs roll over (100 MB a file, five files of each of its logs).
LOGS_BYTES = 4 * 2**30


def pod_config_properties(model: str, spec: ExperimentSpec) -> str:
    addresses = Addresses(
        inference=f"http://0.0.0.0:{INFERENCE_PORT}",
        management=f"http://127.0.0.1:{MANAGEMENT_PORT}",
        metrics=f"http://0.0.0.0:{METRICS_PORT}",
    )
    properties = config_properties(
        model,
        spec.server,
        model_store=MODEL_STORE,
        metrics_config=f"{CONFIG_DIR}/metrics.yaml",
        addresses=addresses,
        number_of_gpu=spec.server.gpus,
    )
    return render_properties(properties)


def config_files(spec: ExperimentSpec) -> dict[str, str]:
    """TorchServe's three files, as a pod reads them from the experiment's ConfigMap."""
    return {
        "config.properties": pod_config_properties(spec.model.name, spec),
        "model-config.yaml": render_model_config(spec.server, spec.load),
        "metrics.yaml": render_metrics_config(),
    }


def server_container(spec: ExperimentSpec, image: str, resources: Manifest) -> Manifest:
    """TorchServe under its launcher (ready once every worker has loaded the model; ended with
    ModelLoadFailed when the handler cannot load it), non-root, read-only root file system."""
    server = spec.server
    launcher = server_launcher(spec.model.name, server.workers, SERVER_LOGS, SERVER_READY_FILE)
    return {
        "name": "torchserve",
        "image": image,
        # sh runs torchserve with these args ("$@"), says when the model is loaded and ends the container
        # when it cannot be (see launcher.server_launcher)
        "command": ["sh", "-c", launcher],
        "args": [
            "torchserve",
            "--foreground",
            "--ncs",
            "--disable-token-auth",
            "--ts-config",
            f"{CONFIG_DIR}/config.properties",
            "--model-store",
            MODEL_STORE,
        ],
        "env": [
            {"name": "LOG_LOCATION", "value": SERVER_LOGS},
            {"name": "METRICS_LOCATION", "value": SERVER_LOGS},
            {"name": "TEMP", "value": "/tmp"},
        ],
        "ports": [
            {"name": "inference", "containerPort": INFERENCE_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        # ready once every worker has loaded the model (/ping is Healthy before that)
        "readinessProbe": {
            "exec": {"command": ["test", "-f", SERVER_READY_FILE]},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        **liveness_probes({"tcpSocket": {"port": "inference"}}, spec.server.startup_timeout_seconds),
        "resources": resources,
        "volumeMounts": [
            {"name": "model-store", "mountPath": MODEL_STORE},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "logs", "mountPath": SERVER_LOGS},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        "securityContext": restricted(),
    }


def plan(spec: ExperimentSpec, inputs: PodInputs, image: str, resources: Manifest) -> PodPlan:
    model = f"{MODEL_STORE}/{spec.model.name}"
    copy_config = f"cp {CONFIG_DIR}/model-config.yaml {model}/model-config.yaml\n"
    return PodPlan(
        config_files=config_files(spec),
        config_dir=CONFIG_DIR,
        init_containers=model_init_containers(spec, inputs, MODEL_STORE, CONFIG_DIR, then=copy_config),
        containers=[server_container(spec, image, resources)],
        volumes=[
            {"name": "config", "configMap": {"name": inputs.config_map}},
            *model_volumes(spec, inputs.model_cache_claim),
            {"name": "logs", "emptyDir": {"sizeLimit": size_limit(LOGS_BYTES)}},
            {"name": "tmp", "emptyDir": {"sizeLimit": size_limit(tmp_bytes(spec))}},
            # PyTorch workers share tensors through /dev/shm; the default 64 MiB is too small.
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        ],
        run_as_user=TORCHSERVE_UID,
        inference_port=INFERENCE_PORT,
        metrics_port=METRICS_PORT,
        metrics_path="/metrics",
    )
