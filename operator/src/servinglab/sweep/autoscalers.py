"""The autoscaler documents a capacity plan exports, typed: each as its project takes it, dumped to YAML.

An `autoscaling/v2` HorizontalPodAutoscaler on a per-pod metric, a KEDA ScaledObject with a Prometheus
trigger, the part of a KServe InferenceService that carries Knative's concurrency target, and a Ray Serve
application's `deployments` with their autoscaling_config. Only the fields servinglab writes are modelled;
the fields are declared in the order they are written (a dump keeps it, so the YAML reads as before).
:mod:`servinglab.sweep.plan` fills them in; :mod:`servinglab.sweep.export` writes them.
"""

from __future__ import annotations

from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Document(BaseModel):
    """A document (or a part of one) that servinglab writes for another project to read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def dumped(self) -> dict[str, object]:
        """The document as JSON-ready data, absent fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def as_yaml(self) -> str:
        return yaml.safe_dump(self.dumped(), sort_keys=False)


class _Kube(Document):
    """A Kubernetes document: its fields are camelCase in the API."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class ObjectMeta(_Kube):
    name: str
    namespace: str | None = None
    annotations: dict[str, str] | None = None


class ScaleTargetRef(_Kube):
    """The workload scaled (KEDA's names it alone; the HPA's names its kind too)."""

    api_version: str | None = None
    kind: str | None = None
    name: str


# -- autoscaling/v2 HorizontalPodAutoscaler -----------------------------------------------------------------


class MetricIdentifier(_Kube):
    name: str


class MetricTarget(_Kube):
    type: Literal["AverageValue"] = "AverageValue"
    #: A Kubernetes quantity ("10", "12500m").
    average_value: str


class PodsMetricSource(_Kube):
    metric: MetricIdentifier
    target: MetricTarget


class PodsMetric(_Kube):
    type: Literal["Pods"] = "Pods"
    pods: PodsMetricSource


class HpaSpec(_Kube):
    scale_target_ref: ScaleTargetRef
    min_replicas: int
    max_replicas: int
    metrics: list[PodsMetric]


class HorizontalPodAutoscaler(_Kube):
    api_version: Literal["autoscaling/v2"] = "autoscaling/v2"
    kind: Literal["HorizontalPodAutoscaler"] = "HorizontalPodAutoscaler"
    metadata: ObjectMeta
    spec: HpaSpec


# -- KEDA ScaledObject --------------------------------------------------------------------------------------


class PrometheusTriggerMetadata(_Kube):
    """KEDA takes a trigger's metadata as strings only."""

    server_address: str
    query: str
    threshold: str


class PrometheusTrigger(_Kube):
    type: Literal["prometheus"] = "prometheus"
    metric_type: Literal["AverageValue"] = "AverageValue"
    metadata: PrometheusTriggerMetadata


class ScaledObjectSpec(_Kube):
    scale_target_ref: ScaleTargetRef
    min_replica_count: int
    max_replica_count: int
    triggers: list[PrometheusTrigger]


class ScaledObject(_Kube):
    api_version: Literal["keda.sh/v1alpha1"] = "keda.sh/v1alpha1"
    kind: Literal["ScaledObject"] = "ScaledObject"
    metadata: ObjectMeta
    spec: ScaledObjectSpec


# -- KServe InferenceService (the part to merge) ------------------------------------------------------------


class PredictorReplicas(_Kube):
    min_replicas: int
    max_replicas: int


class InferenceServiceSpec(_Kube):
    predictor: PredictorReplicas


class InferenceServicePart(_Kube):
    api_version: Literal["serving.kserve.io/v1beta1"] = "serving.kserve.io/v1beta1"
    kind: Literal["InferenceService"] = "InferenceService"
    metadata: ObjectMeta
    spec: InferenceServiceSpec


# -- Ray Serve (snake_case, as Ray's config takes it) -------------------------------------------------------


class RayAutoscalingConfig(Document):
    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float


class RayDeployment(Document):
    name: str
    max_ongoing_requests: int
    autoscaling_config: RayAutoscalingConfig


class RayServeAutoscaling(Document):
    deployments: list[RayDeployment]
