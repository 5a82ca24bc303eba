"""Pure builders of every object the operator creates for one experiment, but the server's own pod parts.

Each function takes the validated spec (and, for the server, the plan its kind gives:
:class:`~servinglab.servers.base.PodPlan`) and the experiment's identity, and returns a manifest; nothing
here talks to the API. Children have deterministic names (:class:`Names`) and an owner reference to the
experiment, so a repeated reconcile finds instead of duplicates them and deleting the experiment
garbage-collects them.

The server: a Deployment of the plan's init containers, containers and volumes, with the spec's GPU
request, node selector and tolerations, non-root, no service-account token; a Service in front of its
inference and metrics ports. The load Job: the servinglab image running `servinglab loadtest`, which
writes its results into the experiment's results ConfigMap (and, for a large document, its parts) through
the API, as a per-experiment ServiceAccount allowed to patch only those and to create ConfigMaps. Pods
carry the experiment's uid as a label and the Job passes it into the results, so a re-applied experiment
of the same name never reads its predecessor's. Used by the experiment reconciler.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import yaml

from servinglab.api import (
    EXPERIMENT_LABEL,
    EXPERIMENT_UID_LABEL,
    GROUP_VERSION,
    KIND,
    ExperimentSpec,
)
from servinglab.api.kube import Resources
from servinglab.k8s import sink
from servinglab.k8s.deadline import load_job_deadline
from servinglab.loadgen import wire
from servinglab.servers.base import Manifest, PodPlan, restricted

EXPERIMENT_DIR = "/etc/servinglab"
EXPERIMENT_FILE = "experiment.yaml"
MANAGED_BY = "servinglab-operator"
#: Where the load Job finds the user's request bodies (a ConfigMap or a claim).
PAYLOAD_DIR = "/etc/servinglab/payload"
UID_LABEL = EXPERIMENT_UID_LABEL
#: The uid the load Job runs as (the servinglab image's non-root user).
LOAD_UID = 65532


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
        EXPERIMENT_LABEL: owner.name,
    }


def selector(owner: Owner, component: str) -> dict[str, str]:
    """The stable subset of labels that selects one component's pods."""
    return {k: v for k, v in labels(owner, component).items() if k.endswith(("/instance", "/component"))}


def pod_selector(owner: Owner, component: str) -> str:
    """Selects the pods of this incarnation of the experiment only (pods carry the experiment's uid)."""
    chosen = {**selector(owner, component), UID_LABEL: owner.uid}
    return ",".join(f"{key}={value}" for key, value in chosen.items())


def owner_reference(owner: Owner, controller: bool = True) -> Manifest:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": controller,
        "blockOwnerDeletion": controller,
    }


def owned_by(manifest: Manifest, uid: str) -> bool:
    """Whether this incarnation of the experiment owns the object: after a delete and re-apply under the
    same name, children of the old one (still being garbage-collected) carry the old uid."""
    return any(ref.get("uid") == uid for ref in manifest.get("metadata", {}).get("ownerReferences") or [])


def _metadata(owner: Owner, name: str, component: str) -> Manifest:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, component),
        "ownerReferences": [owner_reference(owner)],
    }


def config_map(owner: Owner, plan: PodPlan, experiment_document: Manifest) -> Manifest:
    """The server's files (rendered from the spec by its kind) and the experiment the load Job reads (its
    model URL redacted: see :func:`servinglab.k8s.modelsecrets.model_url_secret`)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, Names(owner.name).config, "config"),
        "data": {**plan.config_files, EXPERIMENT_FILE: yaml.safe_dump(experiment_document, sort_keys=False)},
    }


def results_config_map(owner: Owner) -> Manifest:
    """Empty until the load Job writes `results.json`; holds the full results afterwards."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, Names(owner.name).results, "results"),
        "data": {},
    }


def deployment(owner: Owner, spec: ExperimentSpec, plan: PodPlan) -> Manifest:
    """The server: the plan's containers and volumes on a node the spec selects, as the plan's user."""
    server = spec.server
    uid = plan.run_as_user
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, Names(owner.name).server, "server"),
        "spec": {
            "replicas": server.replicas,
            "selector": {"matchLabels": selector(owner, "server")},
            "template": {
                "metadata": {"labels": {**labels(owner, "server"), UID_LABEL: owner.uid}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "nodeSelector": dict(server.node_selector),
                    "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in server.tolerations],
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": uid,
                        "runAsGroup": uid,
                        "fsGroup": uid,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "initContainers": plan.init_containers,
                    "containers": plan.containers,
                    "volumes": plan.volumes,
                },
            },
        },
    }


def service(owner: Owner, plan: PodPlan) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, Names(owner.name).server, "server"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(owner, "server"),
            "ports": [
                {"name": "inference", "port": plan.inference_port, "targetPort": "inference"},
                {"name": "metrics", "port": plan.metrics_port, "targetPort": "metrics"},
            ],
        },
    }


def _payload_volumes(spec: ExperimentSpec) -> list[Manifest]:
    payload = spec.load.payload
    if payload.config_map is not None:
        return [{"name": "payload", "configMap": {"name": payload.config_map}}]
    if payload.pvc is not None:
        return [{"name": "payload", "persistentVolumeClaim": {"claimName": payload.pvc.claim_name, "readOnly": True}}]
    return []


#: Where the first load pod (the coordinator) takes the other load pods' generators.
GENERATOR_PORT = 7100


def generator_count(spec: ExperimentSpec) -> int:
    """Load pods: one per generator (cluster_problems refuses `auto`, a count of local cores)."""
    generators = spec.load.generators
    return generators if isinstance(generators, int) else 1


def load_service(owner: Owner) -> Manifest:
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


def load_network_policy(owner: Owner) -> Manifest:
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


def generator_key_secret(owner: Owner, key: bytes) -> Manifest:
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


def load_service_account(owner: Owner) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(owner, Names(owner.name).load, "load"),
    }


def load_role(owner: Owner) -> Manifest:
    """The load Job may read and patch its own results ConfigMap and the parts of a large document,
    and create ConfigMaps (RBAC cannot restrict a create by name) for those parts."""
    results = Names(owner.name).results
    parts = [sink.part_name(results, index) for index in range(1, sink.MAX_PARTS)]
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


def load_role_binding(owner: Owner) -> Manifest:
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


def _payload_mounts(spec: ExperimentSpec) -> list[Manifest]:
    return [{"name": "payload", "mountPath": PAYLOAD_DIR, "readOnly": True}] if _payload_volumes(spec) else []


def _generator_args(names: Names, count: int) -> list[str]:
    if count == 1:
        return []
    coordinator = f"{names.load}-0.{names.load}:{GENERATOR_PORT}"  # indexed pod 0's hostname.subdomain
    return ["--generators-listen", f"0.0.0.0:{GENERATOR_PORT}", "--generators-join", coordinator]


def load_job(
    owner: Owner,
    spec: ExperimentSpec,
    plan: PodPlan,
    servinglab_image: str,
    flops_per_inference: float | None = None,
    key_secret: str | None = None,
    resources: Resources | None = None,
) -> Manifest:
    """The load Job; `flops_per_inference` (from status.model) spares it importing torch to count them.
    Several generators need `key_secret`, the Secret of their key (:func:`generator_key_secret`). Each
    load pod asks for the spec's `load.resources`, else `resources` (the operator's default): policy
    engines and quotas refuse pods without requests and limits. Its deadline covers the planned load
    (:mod:`servinglab.k8s.deadline`)."""
    chosen = spec.load.resources or resources
    names = Names(owner.name)
    generators = generator_count(spec)
    # several generators: an indexed Job, one pod each, all at once; pod 0 coordinates (see load_service)
    indexed: Manifest = (
        {"completionMode": "Indexed", "completions": generators, "parallelism": generators} if generators > 1 else {}
    )
    pod_extras: Manifest = {"subdomain": names.load} if generators > 1 else {}
    container_extras: Manifest = (
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
            "activeDeadlineSeconds": load_job_deadline(spec).seconds,
            **indexed,
            "template": {
                "metadata": {"labels": {**labels(owner, "load"), UID_LABEL: owner.uid}},
                "spec": {
                    **pod_extras,
                    "restartPolicy": "Never",
                    "serviceAccountName": names.load,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": LOAD_UID, "runAsGroup": LOAD_UID},
                    "containers": [
                        {
                            "name": "loadgen",
                            "image": servinglab_image,
                            "command": ["servinglab", "loadtest"],
                            "args": [
                                "--target",
                                f"http://{names.server}:{plan.inference_port}",
                                "--metrics-url",
                                f"http://{names.server}:{plan.metrics_port}{plan.metrics_path}",
                                "--model",
                                spec.model.name,
                                "--spec-file",
                                f"{EXPERIMENT_DIR}/{EXPERIMENT_FILE}",
                                "--ready-timeout",
                                str(spec.server.startup_timeout_seconds),
                                "--results-configmap",
                                names.results,
                                *_payload_args(spec),
                                *_flops_args(flops_per_inference),
                                *_generator_args(names, generators),
                            ],
                            "env": [
                                {
                                    "name": "POD_NAMESPACE",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                                },
                                {
                                    "name": sink.OWNER_ENV,
                                    "value": json.dumps(owner_reference(owner, controller=False)),
                                },
                                *key_env,
                            ],
                            **container_extras,
                            **({"resources": chosen.manifest()} if chosen is not None else {}),
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "volumeMounts": [
                                {"name": "experiment", "mountPath": EXPERIMENT_DIR, "readOnly": True},
                                *_payload_mounts(spec),
                            ],
                            "securityContext": restricted(read_only_root=False),
                        }
                    ],
                    "volumes": [
                        {
                            "name": "experiment",
                            "configMap": {
                                "name": names.config,
                                "items": [{"key": EXPERIMENT_FILE, "path": EXPERIMENT_FILE}],
                            },
                        },
                        *_payload_volumes(spec),
                    ],
                },
            },
        },
    }
