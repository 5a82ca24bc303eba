"""TorchServe in a pod: its files in the experiment's ConfigMap, the init container that puts the model
into the model store, the server container with its launcher and readiness, and the volumes (pure).

The operator's builders (:mod:`servinglab.k8s.builders`) wrap this plan into the experiment's Deployment:
an init container from the servinglab image builds the built-in model's archive (seeded weights, no
downloads) or fetches, checks and packs the user's (`servinglab prepare-model`: a URL, with credentials
from a Secret mounted into it alone, or a claim mounted read-only into it alone) into an emptyDir and
drops in the experiment's model-config.yaml; the TorchServe container (the spec's pinned image) serves it
with the rendered config.properties. Inference and metrics listen on all interfaces, management on
localhost only.
"""

from __future__ import annotations

from servinglab import modelsource, tsconfig
from servinglab.api import ExperimentSpec
from servinglab.servers.base import Manifest, PodInputs, PodPlan

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
#: Where a pvc model source's claim is mounted, in the init container only.
MODEL_SOURCE_DIR = "/model-source"
#: Where the operator's model cache claim is mounted, in the init container only.
MODEL_CACHE_DIR = "/model-cache"


def restricted(read_only_root: bool = True) -> Manifest:
    """A container security context of the `restricted` Pod Security Standard."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_config_properties(model: str, spec: ExperimentSpec) -> str:
    addresses = tsconfig.Addresses(
        inference=f"http://0.0.0.0:{INFERENCE_PORT}",
        management=f"http://127.0.0.1:{MANAGEMENT_PORT}",
        metrics=f"http://0.0.0.0:{METRICS_PORT}",
    )
    properties = tsconfig.config_properties(
        model,
        spec.server,
        model_store=MODEL_STORE,
        metrics_config=f"{CONFIG_DIR}/metrics.yaml",
        addresses=addresses,
        number_of_gpu=spec.server.gpus,
    )
    return tsconfig.render_properties(properties)


def config_files(spec: ExperimentSpec) -> dict[str, str]:
    """TorchServe's three files, as a pod reads them from the experiment's ConfigMap."""
    return {
        "config.properties": pod_config_properties(spec.model.name, spec),
        "model-config.yaml": tsconfig.render_model_config(spec.server, spec.load),
        "metrics.yaml": tsconfig.render_metrics_config(),
    }


def model_init_container(spec: ExperimentSpec, inputs: PodInputs) -> Manifest:
    """The init container that puts the model into the model store: a built-in one is built from its
    seeded code; the user's is fetched, checked and packed by `servinglab prepare-model`, whose
    termination message is the model's description (or the reason it could not be served). Credentials
    for a URL come from the spec's Secret into this container alone. With a cache claim, builds,
    downloads and packed models are kept on it (mounted here only) and reused by digest."""
    model = spec.model.name
    cached = inputs.model_cache_claim is not None
    mounts: list[Manifest] = [
        {"name": "model-store", "mountPath": MODEL_STORE},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    cache = MODEL_CACHE_DIR if cached else "/tmp/model-cache"
    if cached:
        mounts.append({"name": "model-cache", "mountPath": MODEL_CACHE_DIR})
    env: list[Manifest] = []
    source = spec.model.source
    if source is None:
        script = (
            f"servinglab build-model {model} --build-dir {cache}/builtin --quiet"
            " --termination-log /dev/termination-log\n"
            f"cp -r {cache}/builtin/{model}/{model} {MODEL_STORE}/{model}\n"
        )
    else:
        mounted = ""
        if source.pvc is not None:
            mounts.append({"name": "model-source", "mountPath": MODEL_SOURCE_DIR, "readOnly": True})
            mounted = f" --mounted {MODEL_SOURCE_DIR}"
        if source.authorization_secret is not None:
            secret = source.authorization_secret
            env.append({"name": modelsource.AUTHORIZATION_ENV,
                        "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}})  # fmt: skip
        env.append({"name": "SERVINGLAB_MODEL_CACHE", "value": cache})
        script = (
            f"servinglab prepare-model --spec-file {CONFIG_DIR}/{inputs.experiment_file} "
            f"--into {MODEL_STORE}/{model}{mounted} --termination-log /dev/termination-log\n"
        )
    script += f"cp {CONFIG_DIR}/model-config.yaml {MODEL_STORE}/{model}/model-config.yaml\n"
    container: Manifest = {
        "name": "model",
        "image": inputs.servinglab_image,
        "command": ["sh", "-ec"],
        "args": [script],
        "volumeMounts": mounts,
        "securityContext": restricted(),
    }
    if env:
        container["env"] = env
    return container


def _model_volumes(spec: ExperimentSpec, cache_claim: str | None) -> list[Manifest]:
    volumes = []
    source = spec.model.source
    if source is not None and source.pvc is not None:
        claim = {"claimName": source.pvc.claim_name, "readOnly": True}
        volumes.append({"name": "model-source", "persistentVolumeClaim": claim})
    if cache_claim:
        volumes.append({"name": "model-cache", "persistentVolumeClaim": {"claimName": cache_claim}})
    return volumes


def server_container(spec: ExperimentSpec, image: str, resources: Manifest) -> Manifest:
    """TorchServe under its launcher (ready once every worker has loaded the model; ended with
    ModelLoadFailed when the handler cannot load it), non-root, read-only root file system."""
    server = spec.server
    launcher = tsconfig.server_launcher(spec.model.name, server.workers, SERVER_LOGS, SERVER_READY_FILE)
    return {
        "name": "torchserve",
        "image": image,
        # sh runs torchserve with these args ("$@"), says when the model is loaded and ends the container
        # when it cannot be (see tsconfig.server_launcher)
        "command": ["sh", "-c", launcher],
        "args": [
            "torchserve", "--foreground", "--ncs", "--disable-token-auth",
            "--ts-config", f"{CONFIG_DIR}/config.properties", "--model-store", MODEL_STORE,
        ],  # fmt: skip
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
        "livenessProbe": {"tcpSocket": {"port": "inference"}, "initialDelaySeconds": 30, "periodSeconds": 10},
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
    return PodPlan(
        config_files=config_files(spec),
        config_dir=CONFIG_DIR,
        init_containers=[model_init_container(spec, inputs)],
        containers=[server_container(spec, image, resources)],
        volumes=[
            {"name": "config", "configMap": {"name": inputs.config_map}},
            *_model_volumes(spec, inputs.model_cache_claim),
            {"name": "model-store", "emptyDir": {}},
            {"name": "logs", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
            # PyTorch workers share tensors through /dev/shm; the default 64 MiB is too small.
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        ],
        run_as_user=TORCHSERVE_UID,
        inference_port=INFERENCE_PORT,
        metrics_port=METRICS_PORT,
        metrics_path="/metrics",
    )
