"""Pure builders of every object the operator creates for one ServingExperiment.

Each function takes the validated spec and the experiment's identity and returns a plain manifest
dict; nothing here talks to the API. Children have deterministic names (`names`) and an owner
reference to the experiment, so a repeated reconcile finds instead of duplicates them and deleting
the experiment garbage-collects them.

Server pod: an init container from the servinglab image builds the built-in model's archive (seeded
weights, no downloads) or fetches, checks and packs the user's (`servinglab prepare-model`: a URL, with
credentials from a Secret mounted into it alone, or a claim mounted read-only into it alone) into an
emptyDir and drops in the experiment's model-config.yaml; the TorchServe
container (the spec's pinned image) serves it with the rendered config.properties. Inference and
metrics listen on all interfaces, management on localhost only. Load Job: the servinglab image
running `servinglab loadtest`, which writes its results into the experiment's results ConfigMap (and,
for a large document, its parts) through the API, as a per-experiment ServiceAccount allowed to patch
only those and to create ConfigMaps. Pods carry the experiment's uid as a label and the Job passes it
into the results, so a re-applied experiment of the same name never reads its predecessor's.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import yaml

from servinglab import modelsource, tsconfig
from servinglab.loadgen import results_sink, wire
from servinglab.spec import API_GROUP, API_VERSION, KIND, ExperimentSpec

INFERENCE_PORT = 8080
MANAGEMENT_PORT = 8081
METRICS_PORT = 8082
MODEL_STORE = "/home/model-server/model-store"
CONFIG_DIR = "/etc/torchserve"
#: TorchServe's log folder in the server container (an emptyDir: the root file system is read-only).
SERVER_LOGS = "/home/model-server/logs"
#: Written by the server container's launcher once every worker has loaded the model (on the /tmp emptyDir).
SERVER_READY_FILE = "/tmp/servinglab-model-loaded"
EXPERIMENT_DIR = "/etc/servinglab"
MANAGED_BY = "servinglab-operator"
#: uid of the `model-server` user in the pytorch/torchserve images
TORCHSERVE_UID = 1000


@dataclass(frozen=True)
class Owner:
    """The experiment that owns the children."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class Names:
    """Deterministic child names, all derived from the experiment's name."""

    experiment: str

    @property
    def config(self) -> str:
        return f"{self.experiment}-config"

    @property
    def server(self) -> str:
        return f"{self.experiment}-server"

    @property
    def load(self) -> str:
        return f"{self.experiment}-load"

    @property
    def results(self) -> str:
        return f"{self.experiment}-results"


def labels(owner: Owner, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "servinglab",
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        f"{API_GROUP}/experiment": owner.name,
    }


def selector(owner: Owner, component: str) -> dict[str, str]:
    """The stable subset of labels that selects one component's pods."""
    return {k: v for k, v in labels(owner, component).items() if k.endswith(("/instance", "/component"))}


UID_LABEL = f"{API_GROUP}/experiment-uid"


def pod_selector(owner: Owner, component: str) -> str:
    """Selects the pods of this incarnation of the experiment only (pods carry the experiment's uid)."""
    chosen = {**selector(owner, component), UID_LABEL: owner.uid}
    return ",".join(f"{key}={value}" for key, value in chosen.items())


def owner_reference(owner: Owner, controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": controller,
        "blockOwnerDeletion": controller,
    }


def owned_by(manifest: dict[str, Any], uid: str) -> bool:
    """Whether this incarnation of the experiment owns the object: after a delete and re-apply under the
    same name, children of the old one (still being garbage-collected) carry the old uid."""
    return any(ref.get("uid") == uid for ref in manifest.get("metadata", {}).get("ownerReferences") or [])


def _metadata(owner: Owner, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, component),
        "ownerReferences": [owner_reference(owner)],
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


def config_map(owner: Owner, spec: ExperimentSpec, experiment_document: dict[str, Any]) -> dict[str, Any]:
    """TorchServe's three config files and the experiment the load Job reads."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, Names(owner.name).config, "config"),
        "data": {
            "config.properties": pod_config_properties(spec.model.name, spec),
            "model-config.yaml": tsconfig.render_model_config(spec.server, spec.load),
            "metrics.yaml": tsconfig.render_metrics_config(),
            "experiment.yaml": yaml.safe_dump(experiment_document, sort_keys=False),
        },
    }


def results_config_map(owner: Owner) -> dict[str, Any]:
    """Empty until the load Job writes `results.json`; holds the full results afterwards."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, Names(owner.name).results, "results"),
        "data": {},
    }


def _restricted(read_only_root: bool = True) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


#: Where a pvc model source's claim is mounted, in the init container only.
MODEL_SOURCE_DIR = "/model-source"
#: Where the operator's model cache claim is mounted, in the init container only.
MODEL_CACHE_DIR = "/model-cache"
#: Where the load Job finds the user's request bodies (a ConfigMap or a claim).
PAYLOAD_DIR = "/etc/servinglab/payload"


def model_init_container(spec: ExperimentSpec, servinglab_image: str, cached: bool = False) -> dict[str, Any]:
    """The init container that puts the model into the model store: a built-in one is built from its
    seeded code; the user's is fetched, checked and packed by `servinglab prepare-model`, whose
    termination message is the model's description (or the reason it could not be served). Credentials
    for a URL come from the spec's Secret into this container alone. With `cached`, builds, downloads
    and packed models are kept on the model cache claim (mounted here only) and reused by digest."""
    model = spec.model.name
    mounts: list[dict[str, Any]] = [
        {"name": "model-store", "mountPath": MODEL_STORE},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    cache = MODEL_CACHE_DIR if cached else "/tmp/model-cache"
    if cached:
        mounts.append({"name": "model-cache", "mountPath": MODEL_CACHE_DIR})
    env: list[dict[str, Any]] = []
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
            f"servinglab prepare-model --spec-file {CONFIG_DIR}/experiment.yaml --into {MODEL_STORE}/{model}"
            f"{mounted} --termination-log /dev/termination-log\n"
        )
    script += f"cp {CONFIG_DIR}/model-config.yaml {MODEL_STORE}/{model}/model-config.yaml\n"
    container: dict[str, Any] = {
        "name": "model",
        "image": servinglab_image,
        "command": ["sh", "-ec"],
        "args": [script],
        "volumeMounts": mounts,
        "securityContext": _restricted(),
    }
    if env:
        container["env"] = env
    return container


def _model_volumes(spec: ExperimentSpec, cache_claim: str | None) -> list[dict[str, Any]]:
    volumes = []
    source = spec.model.source
    if source is not None and source.pvc is not None:
        claim = {"claimName": source.pvc.claim_name, "readOnly": True}
        volumes.append({"name": "model-source", "persistentVolumeClaim": claim})
    if cache_claim:
        volumes.append({"name": "model-cache", "persistentVolumeClaim": {"claimName": cache_claim}})
    return volumes


def _payload_volumes(spec: ExperimentSpec) -> list[dict[str, Any]]:
    payload = spec.load.payload
    if payload.config_map is not None:
        return [{"name": "payload", "configMap": {"name": payload.config_map}}]
    if payload.pvc is not None:
        return [{"name": "payload", "persistentVolumeClaim": {"claimName": payload.pvc.claim_name, "readOnly": True}}]
    return []


def deployment(
    owner: Owner, spec: ExperimentSpec, servinglab_image: str, model_cache_claim: str | None = None
) -> dict[str, Any]:
    server = spec.server
    names = Names(owner.name)
    pod_labels = {**labels(owner, "server"), UID_LABEL: owner.uid}
    limits: dict[str, str] = dict(server.resources.limits)
    if server.gpus:
        limits["nvidia.com/gpu"] = str(server.gpus)
    resources: dict[str, Any] = {"limits": limits} if limits else {}
    launcher = tsconfig.server_launcher(spec.model.name, server.workers, SERVER_LOGS, SERVER_READY_FILE)
    if server.resources.requests:
        resources["requests"] = dict(server.resources.requests)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, names.server, "server"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector(owner, "server")},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "nodeSelector": dict(server.node_selector),
                    "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in server.tolerations],
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": TORCHSERVE_UID,
                        "runAsGroup": TORCHSERVE_UID,
                        "fsGroup": TORCHSERVE_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "initContainers": [model_init_container(spec, servinglab_image, bool(model_cache_claim))],
                    "containers": [
                        {
                            "name": "torchserve",
                            "image": server.image,
                            # sh runs torchserve with these args ("$@"), says when the model is loaded and
                            # ends the container when it cannot be (see tsconfig.server_launcher)
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
                            "livenessProbe": {
                                "tcpSocket": {"port": "inference"},
                                "initialDelaySeconds": 30,
                                "periodSeconds": 10,
                            },
                            "resources": resources,
                            "volumeMounts": [
                                {"name": "model-store", "mountPath": MODEL_STORE},
                                {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                                {"name": "logs", "mountPath": SERVER_LOGS},
                                {"name": "tmp", "mountPath": "/tmp"},
                                {"name": "shm", "mountPath": "/dev/shm"},
                            ],
                            "securityContext": _restricted(),
                        }
                    ],
                    "volumes": [
                        {"name": "config", "configMap": {"name": names.config}},
                        *_model_volumes(spec, model_cache_claim),
                        {"name": "model-store", "emptyDir": {}},
                        {"name": "logs", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {}},
                        # PyTorch workers share tensors through /dev/shm; the default 64 MiB is too small.
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                    ],
                },
            },
        },
    }


def service(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, Names(owner.name).server, "server"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(owner, "server"),
            "ports": [
                {"name": "inference", "port": INFERENCE_PORT, "targetPort": "inference"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }


#: Where the first load pod (the coordinator) takes the other load pods' generators.
GENERATOR_PORT = 7100


def generator_count(spec: ExperimentSpec) -> int:
    """Load pods: one per generator (cluster_problems refuses `auto`, a count of local cores)."""
    generators = spec.load.generators
    return generators if isinstance(generators, int) else 1


def load_service(owner: Owner) -> dict[str, Any]:
    """A headless Service for the load pods of a multi-generator Job: it gives the first pod the DNS
    name `<job>-0.<job>` the others join it by (published before the pods are ready: they are never)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, Names(owner.name).load, "load"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector(owner, "load"),
            "ports": [{"name": "generators", "port": GENERATOR_PORT, "targetPort": "generators"}],
        },
    }


def load_network_policy(owner: Owner) -> dict[str, Any]:
    """A multi-generator experiment's load pods admit connections only to the generators' port, and only
    from this experiment's own load pods (by its uid: not a same-named predecessor's, not another
    experiment's). Defence in depth beside the generator key: a port scanner never reaches the port.
    Needs a network plugin that enforces NetworkPolicy."""
    own_load_pods = {"matchLabels": {"app.kubernetes.io/component": "load", UID_LABEL: owner.uid}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(owner, Names(owner.name).load, "load"),
        "spec": {
            "podSelector": own_load_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": own_load_pods}], "ports": [{"protocol": "TCP", "port": GENERATOR_PORT}]}
            ],
        },
    }


#: The field of the generator-key Secret that holds the key (hex text: it is read into an env variable).
GENERATOR_KEY_FIELD = "key"


def generator_key_secret(owner: Owner, key: bytes) -> dict[str, Any]:
    """The key a multi-generator experiment's load pods prove to each other (:mod:`servinglab.loadgen.wire`),
    for the operator to create once. The API server names it (`generateName`): the operator may create
    Secrets but never read one, so it keeps the name it was given in status and hands it to the Job; a
    name is not a secret, and no other object can claim it in advance. Immutable: never rotated under
    running pods."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "generateName": f"{Names(owner.name).load}-key-",
            "namespace": owner.namespace,
            "labels": labels(owner, "load"),
            "ownerReferences": [owner_reference(owner)],
        },
        "type": "Opaque",
        "immutable": True,
        "data": {GENERATOR_KEY_FIELD: base64.b64encode(wire.key_to_text(key).encode()).decode()},
    }


def load_service_account(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(owner, Names(owner.name).load, "load"),
    }


def load_role(owner: Owner) -> dict[str, Any]:
    """The load Job may read and patch its own results ConfigMap and the parts of a large document,
    and create ConfigMaps (RBAC cannot restrict a create by name) for those parts."""
    results = Names(owner.name).results
    parts = [results_sink.part_name(results, index) for index in range(1, results_sink.MAX_PARTS)]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(owner, Names(owner.name).load, "load"),
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [results, *parts],
             "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        ],
    }  # fmt: skip


def load_role_binding(owner: Owner) -> dict[str, Any]:
    name = Names(owner.name).load
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(owner, name, "load"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
    }


def _flops_args(flops_per_inference: float | None) -> list[str]:
    return ["--flops-per-inference", str(int(flops_per_inference))] if flops_per_inference else []


def _payload_args(spec: ExperimentSpec) -> list[str]:
    payload = spec.load.payload
    if payload.pvc is not None:
        return ["--payload-dir", f"{PAYLOAD_DIR}/{payload.pvc.path}"]
    return ["--payload-dir", PAYLOAD_DIR] if payload.config_map is not None else []


def _payload_mounts(spec: ExperimentSpec) -> list[dict[str, Any]]:
    return [{"name": "payload", "mountPath": PAYLOAD_DIR, "readOnly": True}] if _payload_volumes(spec) else []


def _generator_args(names: Names, count: int) -> list[str]:
    if count == 1:
        return []
    coordinator = f"{names.load}-0.{names.load}:{GENERATOR_PORT}"  # indexed pod 0's hostname.subdomain
    return ["--generators-listen", f"0.0.0.0:{GENERATOR_PORT}", "--generators-join", coordinator]


def load_job(
    owner: Owner,
    spec: ExperimentSpec,
    servinglab_image: str,
    flops_per_inference: float | None = None,
    key_secret: str | None = None,
) -> dict[str, Any]:
    """The load Job; `flops_per_inference` (from status.model) spares it importing torch to count them.
    Several generators need `key_secret`, the Secret of their key (:func:`generator_key_secret`)."""
    names = Names(owner.name)
    load = spec.load
    # Generous bound: every level's warm-up and longest measurement, plus stragglers and start-up.
    if load.mode == "closed":
        levels = len(load.concurrency)
    else:
        levels = len(load.rates) + (load.rate_search.max_probes if load.rate_search is not None else 0)
    measured = max(load.duration_seconds, load.stability.max_duration_seconds or 0.0)
    deadline = int(levels * (load.warmup_seconds + measured + load.request_timeout_seconds) + 300)
    generators = generator_count(spec)
    # several generators: an indexed Job, one pod each, all at once; pod 0 coordinates (see load_service)
    indexed: dict[str, Any] = (
        {"completionMode": "Indexed", "completions": generators, "parallelism": generators} if generators > 1 else {}
    )
    pod_extras: dict[str, Any] = {"subdomain": names.load} if generators > 1 else {}
    container_extras: dict[str, Any] = (
        {"ports": [{"name": "generators", "containerPort": GENERATOR_PORT}]} if generators > 1 else {}
    )
    if generators > 1 and not key_secret:
        raise ValueError(f"a load Job of {generators} generators needs the Secret of their key")
    key_env = (
        [{"name": wire.KEY_ENV, "valueFrom": {"secretKeyRef": {"name": key_secret, "key": GENERATOR_KEY_FIELD}}}]
        if generators > 1
        else []
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(owner, names.load, "load"),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline,
            **indexed,
            "template": {
                "metadata": {"labels": {**labels(owner, "load"), UID_LABEL: owner.uid}},
                "spec": {
                    **pod_extras,
                    "restartPolicy": "Never",
                    "serviceAccountName": names.load,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
                    "containers": [
                        {
                            "name": "loadgen",
                            "image": servinglab_image,
                            "command": ["servinglab", "loadtest"],
                            "args": [
                                "--target",
                                f"http://{names.server}:{INFERENCE_PORT}",
                                "--metrics-url",
                                f"http://{names.server}:{METRICS_PORT}/metrics",
                                "--model",
                                spec.model.name,
                                "--spec-file",
                                f"{EXPERIMENT_DIR}/experiment.yaml",
                                "--ready-timeout",
                                str(spec.server.startup_timeout_seconds),
                                "--results-configmap",
                                names.results,
                                *_payload_args(spec),
                                *_flops_args(flops_per_inference),
                                *_generator_args(names, generators),
                            ],  # fmt: skip
                            "env": [
                                {
                                    "name": "POD_NAMESPACE",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                                },
                                {
                                    "name": results_sink.OWNER_ENV,
                                    "value": json.dumps(owner_reference(owner, controller=False)),
                                },
                                *key_env,
                            ],
                            **container_extras,
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "volumeMounts": [
                                {"name": "experiment", "mountPath": EXPERIMENT_DIR, "readOnly": True},
                                *_payload_mounts(spec),
                            ],
                            "securityContext": _restricted(read_only_root=False),
                        }
                    ],
                    "volumes": [
                        {
                            "name": "experiment",
                            "configMap": {
                                "name": names.config,
                                "items": [{"key": "experiment.yaml", "path": "experiment.yaml"}],
                            },
                        },
                        *_payload_volumes(spec),
                    ],
                },
            },
        },
    }
