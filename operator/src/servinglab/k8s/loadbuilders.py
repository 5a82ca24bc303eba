"""Pure builders of the load Job and what it needs beside it. The Job runs the servinglab image's
`servinglab loadtest`, which writes its results into the experiment's results ConfigMap (and, for a large
document, its parts) through the API, and passes the experiment's uid into them. Beside it: the
per-experiment ServiceAccount, Role and RoleBinding that let its pods write the results ConfigMaps alone;
with several generators, the headless Service they find each other by, the NetworkPolicy that admits only
their own kind, and the Secret of the key they prove. Names, labels and owner references are the
experiment's (:mod:`servinglab.k8s.builders`). Used by the experiment reconciler.
"""

from __future__ import annotations

import base64
import json

from servinglab.api import (
    ExperimentSpec,
)
from servinglab.api.kube import Resources
from servinglab.k8s import sink
from servinglab.k8s.builders import (
    EXPERIMENT_DIR,
    EXPERIMENT_FILE,
    UID_LABEL,
    Names,
    Owner,
    child_metadata,
    labels,
    owner_reference,
    selector,
)
from servinglab.k8s.deadline import load_job_deadline
from servinglab.loadgen import wire
from servinglab.servers.base import Manifest, PodPlan, restricted

#: Where the load Job finds the user's request bodies (a ConfigMap or a claim).
PAYLOAD_DIR = "/etc/servinglab/payload"
#: The uid the load Job runs as (the servinglab image's non-root user).
LOAD_UID = 65532


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
        "metadata": child_metadata(owner, Names(owner.name).load, "load"),
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
        "metadata": child_metadata(owner, Names(owner.name).load, "load"),
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
        "metadata": child_metadata(owner, Names(owner.name).load, "load"),
    }


def load_role(owner: Owner) -> Manifest:
    """The load Job may read and patch its own results ConfigMap and the parts of a large document,
    and create ConfigMaps (RBAC cannot restrict a create by name) for those parts."""
    results = Names(owner.name).results
    parts = [sink.part_name(results, index) for index in range(1, sink.MAX_PARTS)]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": child_metadata(owner, Names(owner.name).load, "load"),
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
        "metadata": child_metadata(owner, name, "load"),
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
    utilisation_source: str | None = None,
) -> Manifest:
    """The load Job; `flops_per_inference` (from status.model) spares it importing torch to count them;
    `utilisation_source` says where it reads the server's utilisation (for `load.utilisationTarget`).
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
        "metadata": child_metadata(owner, names.load, "load"),
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
                                *(["--utilisation-source", utilisation_source] if utilisation_source else []),
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
