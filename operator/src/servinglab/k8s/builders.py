"""Pure builders of every object the operator creates for one experiment, but the server's own pod parts.

Each function takes the validated spec (and, for the server, the plan its kind gives:
:class:`~servinglab.servers.base.PodPlan`) and the experiment's identity, and returns a manifest; nothing
here talks to the API. Children have deterministic names (:class:`Names`) and an owner reference to the
experiment, so a repeated reconcile finds instead of duplicates them and deleting the experiment
garbage-collects them.

The server: a Deployment of the plan's init containers, containers and volumes, with the spec's GPU
request, node selector and tolerations, non-root, no service-account token; a Service in front of its
inference and metrics ports; the ConfigMaps of the server's files and of the results. Pods carry the
experiment's uid as a label, so a re-applied experiment of the same name never reads its predecessor's.
The load Job and its companions are built by :mod:`servinglab.k8s.loadbuilders`. Used by the experiment
reconciler.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from servinglab.api import (
    EXPERIMENT_LABEL,
    EXPERIMENT_UID_LABEL,
    GROUP_VERSION,
    KIND,
    ExperimentSpec,
)
from servinglab.servers.base import Manifest, PodPlan

EXPERIMENT_DIR = "/etc/servinglab"
EXPERIMENT_FILE = "experiment.yaml"
MANAGED_BY = "servinglab-operator"
UID_LABEL = EXPERIMENT_UID_LABEL


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


def child_metadata(owner: Owner, name: str, component: str) -> Manifest:
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
        "metadata": child_metadata(owner, Names(owner.name).config, "config"),
        "data": {**plan.config_files, EXPERIMENT_FILE: yaml.safe_dump(experiment_document, sort_keys=False)},
    }


def results_config_map(owner: Owner) -> Manifest:
    """Empty until the load Job writes `results.json`; holds the full results afterwards."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(owner, Names(owner.name).results, "results"),
        "data": {},
    }


def deployment(owner: Owner, spec: ExperimentSpec, plan: PodPlan) -> Manifest:
    """The server: the plan's containers and volumes on a node the spec selects, as the plan's user."""
    server = spec.server
    uid = plan.run_as_user
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(owner, Names(owner.name).server, "server"),
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
        "metadata": child_metadata(owner, Names(owner.name).server, "server"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(owner, "server"),
            "ports": [
                {"name": "inference", "port": plan.inference_port, "targetPort": "inference"},
                {"name": "metrics", "port": plan.metrics_port, "targetPort": "metrics"},
            ],
        },
    }
