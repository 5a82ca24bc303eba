"""TorchServe in a pod: its files in the experiment's ConfigMap, the init container that puts the model
into the model store, the server container with its launcher and readiness, and the volumes (pure).

The operator's builders (:mod:`servinglab.k8s.builders`) wrap this plan into the experiment's Deployment.
An init container from the servinglab image (`model`) builds the built-in model's archive (seeded
weights, no downloads) or fetches, checks and lays out the user's (`servinglab prepare-model`: a URL, with
credentials from a Secret mounted into it alone, or a claim mounted read-only into it alone) into an
emptyDir and drops in the experiment's model-config.yaml. It runs only servinglab's code, so it alone
mounts the model cache claim (read-write: it keeps downloads and builds there). A user's model is then
counted (`servinglab count-model`, which loads it: a .pt2 unpickles) by a second init container (`probe`)
with the model store read-only and no cache, claim or credentials. The TorchServe container (the spec's
pinned image) serves the model store with the rendered config.properties and never mounts the cache.
Every emptyDir has a sizeLimit (the model store's from the source's maxBytes), so a model cannot fill the
node's disk. Inference and metrics listen on all interfaces, management on localhost only.
"""

from __future__ import annotations

from servinglab.api import ExperimentSpec
from servinglab.models.fetch import AUTHORIZATION_ENV
from servinglab.servers.base import MODEL_INIT, PROBE_INIT, Manifest, PodInputs, PodPlan, restricted, size_limit
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
#: Where a pvc model source's claim is mounted, in the init container only.
MODEL_SOURCE_DIR = "/model-source"
#: Where the operator's model cache claim is mounted, in the init container only.
MODEL_CACHE_DIR = "/model-cache"

_GI = 2**30
#: What a built-in model may take (resnet50's archive is about 100 MB), in place of a source's maxBytes.
BUILTIN_MODEL_BYTES = _GI
#: Room beside the model in the model store: servinglab's handler, the rendered config, the description.
_STORE_MARGIN_BYTES = _GI // 4
#: TorchServe's logs roll over (100 MB a file, five files of each of its logs).
LOGS_BYTES = 4 * _GI
#: The probe's scratch: torch and the model's loader may want a /tmp.
PROBE_TMP_BYTES = _GI


def model_bytes(spec: ExperimentSpec) -> int:
    """The most the model may take on disk: the source's maxBytes, or what a built-in model takes."""
    source = spec.model.source
    return source.max_bytes if source is not None else BUILTIN_MODEL_BYTES


def model_store_bytes(spec: ExperimentSpec) -> int:
    """The model store's sizeLimit: twice the model (an archive and what it unpacks to are both there while
    it is unpacked; a download, before it is moved into place) and the margin."""
    return 2 * model_bytes(spec) + _STORE_MARGIN_BYTES


def tmp_bytes(spec: ExperimentSpec) -> int:
    """/tmp of the model init container and TorchServe: a built-in build without a cache claim, TorchServe's
    temporary files (which may hold a copy of the model)."""
    return model_bytes(spec) + _GI


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


def model_init_container(spec: ExperimentSpec, inputs: PodInputs) -> Manifest:
    """The init container that puts the model into the model store: a built-in one is built from its
    seeded code; the user's is fetched, checked and laid out by `servinglab prepare-model`, whose
    termination message is the model's description (or the reason it could not be served). Credentials
    for a URL come from the spec's Secret into this container alone. With a cache claim, builds and
    downloads are kept on it (mounted here only: nothing of the user's runs here) and reused once
    re-checked against their digests; the copy in the model store is what was checked."""
    model = spec.model.name
    cached = inputs.model_cache_claim is not None
    mounts: list[Manifest] = [
        {"name": "model-store", "mountPath": MODEL_STORE},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if cached:
        mounts.append({"name": "model-cache", "mountPath": MODEL_CACHE_DIR})
    env: list[Manifest] = []
    source = spec.model.source
    if source is None:
        builds = f"{MODEL_CACHE_DIR if cached else '/tmp/model-cache'}/builtin"
        script = (
            f"servinglab build-model {model} --build-dir {builds} --into {MODEL_STORE}/{model} --quiet"
            " --termination-log /dev/termination-log\n"
        )
    else:
        options = f" --cache {MODEL_CACHE_DIR}" if cached else ""
        if source.pvc is not None:
            mounts.append({"name": "model-source", "mountPath": MODEL_SOURCE_DIR, "readOnly": True})
            options += f" --mounted {MODEL_SOURCE_DIR}"
        if source.authorization_secret is not None:
            secret = source.authorization_secret
            env.append({"name": AUTHORIZATION_ENV,
                        "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}})  # fmt: skip
        script = (
            f"servinglab prepare-model --spec-file {CONFIG_DIR}/{inputs.experiment_file} "
            f"--into {MODEL_STORE}/{model}{options} --no-count --termination-log /dev/termination-log\n"
        )
    script += f"cp {CONFIG_DIR}/model-config.yaml {MODEL_STORE}/{model}/model-config.yaml\n"
    container: Manifest = {
        "name": MODEL_INIT,
        "image": inputs.servinglab_image,
        "command": ["sh", "-ec"],
        "args": [script],
        "volumeMounts": mounts,
        "securityContext": restricted(),
    }
    if env:
        container["env"] = env
    return container


def probe_init_container(spec: ExperimentSpec, inputs: PodInputs) -> Manifest:
    """The init container that counts a user's model (`servinglab count-model`): loading it runs the user's
    code (a .pt2 unpickles), so it sees the model store read-only and its own /tmp, nothing else: no cache
    claim, no source claim, no credentials. Its termination message is the counts."""
    return {
        "name": PROBE_INIT,
        "image": inputs.servinglab_image,
        "command": ["servinglab", "count-model", f"{MODEL_STORE}/{spec.model.name}"],
        "args": ["--termination-log", "/dev/termination-log"],
        "volumeMounts": [
            {"name": "model-store", "mountPath": MODEL_STORE, "readOnly": True},
            {"name": "probe-tmp", "mountPath": "/tmp"},
        ],
        "securityContext": restricted(),
    }


def _model_volumes(spec: ExperimentSpec, cache_claim: str | None) -> list[Manifest]:
    volumes: list[Manifest] = [{"name": "model-store", "emptyDir": {"sizeLimit": size_limit(model_store_bytes(spec))}}]
    source = spec.model.source
    if source is not None:
        volumes.append({"name": "probe-tmp", "emptyDir": {"sizeLimit": size_limit(PROBE_TMP_BYTES)}})
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
    probe = [probe_init_container(spec, inputs)] if spec.model.source is not None else []
    return PodPlan(
        config_files=config_files(spec),
        config_dir=CONFIG_DIR,
        init_containers=[model_init_container(spec, inputs), *probe],
        containers=[server_container(spec, image, resources)],
        volumes=[
            {"name": "config", "configMap": {"name": inputs.config_map}},
            *_model_volumes(spec, inputs.model_cache_claim),
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
