"""Admission policies for the cluster tests, the API server's own (CEL): a ValidatingAdmissionPolicy refuses
requests as a policy engine (Gatekeeper, Kyverno) would; a MutatingAdmissionPolicy changes what a
controller writes. Each is bound to one namespace and removed on exit."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from clusterenv.controlplane import Cluster

#: How long the API server's admission takes to pick up a new or deleted policy (it watches them).
SETTLE_SECONDS = 3


def _binding(kind: str, name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": f"{kind}Binding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            **spec,
        },
    }


@contextmanager
def _installed(
    cluster: Cluster, kind: str, policy: dict[str, Any], binding: dict[str, Any]
) -> Iterator[Callable[[], None]]:
    """The policy in force; yields `lift()`, which removes it early and waits until admission has let go of
    it (it is removed on exit in any case)."""
    name = policy["metadata"]["name"]
    cluster.kubectl.apply(policy, binding)
    time.sleep(SETTLE_SECONDS)
    lifted = False

    def remove() -> None:
        cluster.kubectl.run("delete", f"{kind.lower()}binding", name, "--ignore-not-found", check=False)
        cluster.kubectl.run("delete", kind.lower(), name, "--ignore-not-found", check=False)

    def lift() -> None:
        nonlocal lifted
        remove()
        lifted = True
        time.sleep(SETTLE_SECONDS)

    try:
        yield lift
    finally:
        if not lifted:
            remove()


@contextmanager
def refusing(
    cluster: Cluster, namespace: str, rules: list[dict[str, Any]], allow_when: str, message: str
) -> Iterator[Callable[[], None]]:
    """Requests matching `rules` in `namespace` are refused with `message` unless the CEL `allow_when` holds;
    yields `lift()`, which ends the refusal early."""
    name = f"refuse-{uuid.uuid4().hex[:6]}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "validations": [{"expression": allow_when, "message": message}],
        },
    }
    binding = _binding("ValidatingAdmissionPolicy", name, namespace, validationActions=["Deny"])
    with _installed(cluster, "ValidatingAdmissionPolicy", policy, binding) as lift:
        yield lift


@contextmanager
def mutating(
    cluster: Cluster, namespace: str, rules: list[dict[str, Any]], when: str, json_patch: str
) -> Iterator[None]:
    """Requests matching `rules` in `namespace` for which the CEL `when` holds are changed by the CEL
    `json_patch` (a list of JSONPatch operations) before they are stored."""
    name = f"mutate-{uuid.uuid4().hex[:6]}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {"resourceRules": rules},
            "matchConditions": [{"name": "when", "expression": when}],
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": json_patch}}],
        },
    }
    binding = _binding("MutatingAdmissionPolicy", name, namespace)
    with _installed(cluster, "MutatingAdmissionPolicy", policy, binding):
        yield
