"""The operator's settings, read from its environment (the Helm chart sets it from its values).

Read once at start-up by :mod:`servinglab.k8s.main` and handed to every reconcile pass.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from servinglab.api.kube import Resources, image_problem, resource_problem
from servinglab.k8s import credentials
from servinglab.k8s import pricing as prices
from servinglab.servers.base import GPU_RESOURCE

#: A load pod's requests and limits unless the chart or the experiment says otherwise: the generator is one
#: busy process (a core, with room for its threads); its raw samples grow with the requests it sends.
LOAD_RESOURCES = Resources(requests={"cpu": "1", "memory": "512Mi"}, limits={"cpu": "2", "memory": "4Gi"})


@dataclass(frozen=True)
class Settings:
    """Operator settings; :meth:`from_env` reads them from the environment (the Helm chart sets it)."""

    servinglab_image: str = "servinglab/servinglab:0.1.0"
    """Image of the model-builder init container and the load Job (SERVINGLAB_IMAGE)."""
    prometheus_url: str | None = None
    """Default Prometheus for GPU metrics when an experiment names none (SERVINGLAB_PROMETHEUS_URL)."""
    prometheus_authorization: str | None = field(default=None, repr=False)  # a credential: never in a log line
    """The Authorization header sent to that Prometheus alone, never to one an experiment names
    (SERVINGLAB_PROMETHEUS_AUTHORIZATION, from the Secret the chart's prometheusAuthorizationSecret names)."""
    poll_seconds: float = 2.0
    """How often a running experiment is reconciled (SERVINGLAB_POLL_SECONDS)."""
    unschedulable_grace_seconds: float = 30.0
    """How long the server pod may stay unschedulable before the experiment fails
    (SERVINGLAB_UNSCHEDULABLE_GRACE_SECONDS)."""
    lease_namespace: str = "default"
    """Where the leader-election Lease lives: the operator's own namespace, whatever it watches, so that
    every replica of one install contends for the same Lease (:func:`own_namespace`)."""
    lease_seconds: float = 15.0
    """How long a silent leader keeps the Lease before a standby takes over (SERVINGLAB_LEASE_SECONDS)."""
    model_credentials: tuple[credentials.AllowedCredential, ...] = ()
    """The Secret keys experiments may send as model credentials, and to which hosts
    (SERVINGLAB_MODEL_CREDENTIALS, JSON; the chart's modelCredentials). Empty: none may."""
    model_cache_claim: str | None = None
    """A ReadWriteMany claim, in each watched namespace, where server pods keep models by digest
    (SERVINGLAB_MODEL_CACHE_CLAIM; the chart's modelCache.claimName)."""
    gpu_resource: str = GPU_RESOURCE
    """The extended resource a server's GPUs are requested as and counted in (SERVINGLAB_GPU_RESOURCE; the
    chart's gpuResource): nvidia.com/gpu, a MIG profile such as nvidia.com/mig-1g.5gb, another vendor's."""
    failing_seconds: float = 300.0
    """How long an experiment's passes may keep failing (an error the API keeps answering, a bug) before it
    fails with the error and its server is removed (SERVINGLAB_FAILING_SECONDS)."""
    start_grace_seconds: float = 30.0
    """How long a pod may keep failing to start (an image that cannot be pulled, a missing Secret, a pod the
    API refuses to create, a missing payload) before the experiment fails (SERVINGLAB_START_GRACE_SECONDS)."""
    node_grace_seconds: float = 60.0
    """How long a server pod's node may stay not Ready (a kubelet restart, a missed heartbeat: its pods keep
    serving) before the experiment fails as ServerLost (SERVINGLAB_NODE_GRACE_SECONDS). A deleted node ends
    it at once."""
    load_resources: Resources = field(default_factory=lambda: LOAD_RESOURCES)
    """Each load pod's requests and limits when the experiment gives none (SERVINGLAB_LOAD_RESOURCES, JSON
    `{"requests": {...}, "limits": {...}}`; the chart's loadJob.resources)."""

    pricing: prices.Pricing = field(default_factory=prices.Pricing)
    """What a server replica costs per hour by its node, for an experiment without spec.cost
    (SERVINGLAB_PRICING, JSON; the chart's pricing)."""

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        gpu_resource = env.get("SERVINGLAB_GPU_RESOURCE") or cls.gpu_resource
        if (problem := resource_problem(gpu_resource)) is not None:
            raise ValueError(f"SERVINGLAB_GPU_RESOURCE: {problem}")
        image = env.get("SERVINGLAB_IMAGE", cls.servinglab_image)
        if (problem := image_problem(image)) is not None:  # the chart's experimentImage: refused at start, not at pull
            raise ValueError(f"SERVINGLAB_IMAGE: {problem}")
        return cls(
            servinglab_image=image,
            prometheus_url=env.get("SERVINGLAB_PROMETHEUS_URL") or None,
            prometheus_authorization=env.get("SERVINGLAB_PROMETHEUS_AUTHORIZATION") or None,
            poll_seconds=float(env.get("SERVINGLAB_POLL_SECONDS", cls.poll_seconds)),
            unschedulable_grace_seconds=float(
                env.get("SERVINGLAB_UNSCHEDULABLE_GRACE_SECONDS", cls.unschedulable_grace_seconds)
            ),
            lease_namespace=own_namespace(env),
            lease_seconds=float(env.get("SERVINGLAB_LEASE_SECONDS", cls.lease_seconds)),
            model_cache_claim=env.get("SERVINGLAB_MODEL_CACHE_CLAIM") or None,
            model_credentials=credentials.parse(env.get(credentials.ENV, "")),
            gpu_resource=gpu_resource,
            failing_seconds=float(env.get("SERVINGLAB_FAILING_SECONDS", cls.failing_seconds)),
            start_grace_seconds=float(env.get("SERVINGLAB_START_GRACE_SECONDS", cls.start_grace_seconds)),
            node_grace_seconds=float(env.get("SERVINGLAB_NODE_GRACE_SECONDS", cls.node_grace_seconds)),
            load_resources=_resources(env.get("SERVINGLAB_LOAD_RESOURCES", "")),
            pricing=prices.parse(env.get(prices.ENV, "")),
        )


#: Where Kubernetes tells a pod its namespace, beside its service account's token.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace(env: Mapping[str, str]) -> str:
    """The operator's namespace: SERVINGLAB_LEASE_NAMESPACE if set, else POD_NAMESPACE (the chart sets it
    from the pod), else the pod's service-account namespace, else `default` (a run outside a cluster)."""
    if named := env.get("SERVINGLAB_LEASE_NAMESPACE") or env.get("POD_NAMESPACE"):
        return named
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or Settings.lease_namespace
    except OSError:
        return Settings.lease_namespace


def _resources(text: str) -> Resources:
    """SERVINGLAB_LOAD_RESOURCES: the load pods' default resources; a bad value stops the operator at start."""
    if not text.strip():
        return LOAD_RESOURCES
    try:
        return Resources.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"SERVINGLAB_LOAD_RESOURCES: not requests and limits: {exc}") from None
