"""From a winner's measurements to a capacity plan and the autoscaler documents that apply it (pure).

One replica's capacity within the SLO (a sweep's named best, its confirmation mean and interval when it has
one; an experiment's best level) and the mean latency there give the requests in flight on a replica at
capacity by Little's law (throughput x mean latency). With a headroom h, each replica is planned to carry
capacity x (1 - h); a peak rate then needs ceil(peak / (capacity x (1 - h))) replicas, and with a price per
replica-hour that many cost replicas x price per hour.

The builders turn a plan into what autoscalers take, each a typed document (:mod:`servinglab.sweep.autoscalers`)
ready to write as YAML: an `autoscaling/v2`
HorizontalPodAutoscaler on a per-pod in-flight metric, a KEDA ScaledObject with a Prometheus trigger, a
KServe InferenceService's Knative concurrency annotations, and a Ray Serve deployment's autoscaling_config.
"""

from __future__ import annotations

import math

from servinglab.api.capacity import NO_CAPACITY, NO_PEAK, CapacityPlan, CapacitySpec
from servinglab.api.cost import NO_PRICE, CostSpec
from servinglab.api.results import ExperimentResults
from servinglab.api.trials import SweepBest
from servinglab.sweep.autoscalers import (
    HorizontalPodAutoscaler,
    HpaSpec,
    InferenceServicePart,
    InferenceServiceSpec,
    MetricIdentifier,
    MetricTarget,
    ObjectMeta,
    PodsMetric,
    PodsMetricSource,
    PredictorReplicas,
    PrometheusTrigger,
    PrometheusTriggerMetadata,
    RayAutoscalingConfig,
    RayDeployment,
    RayServeAutoscaling,
    ScaledObject,
    ScaledObjectSpec,
    ScaleTargetRef,
)

#: The per-pod metric the HPA and KEDA scale on: the requests a replica holds (queued or being served).
IN_FLIGHT_METRIC = "servinglab_inflight_requests"
#: KEDA's serverAddress when the spec names no Prometheus (metrics.prometheusUrl): replace it with yours.
PLACEHOLDER_PROMETHEUS = "http://prometheus.monitoring.svc:9090"

#: A ratio within this of a whole number is that number (a peak exactly at n replicas' targets needs n).
_EPSILON = 1e-9


def replicas_for(peak_rps: float, capacity_rps: float, headroom: float) -> int:
    """ceil(peak / (capacity x (1 - headroom))): the replicas that serve `peak_rps` each below its target."""
    per_replica = capacity_rps * (1 - headroom)
    return max(1, math.ceil(peak_rps / per_replica - _EPSILON))


def in_flight(throughput_rps: float, latency_mean_ms: float) -> float:
    """Little's law: the requests in flight on average = throughput x mean time in the system (seconds)."""
    return throughput_rps * latency_mean_ms / 1000


def plan(
    capacity_rps: float | None,
    latency_mean_ms: float | None,
    wanted: CapacitySpec | None,
    price: CostSpec | None,
    interval: tuple[float | None, float | None] = (None, None),
    configuration: str | None = None,
) -> CapacityPlan:
    """The plan for one replica of `capacity_rps` within the SLO (`interval`: its confirmation's 95 % bounds)."""
    wanted = wanted or CapacitySpec()
    if not capacity_rps or capacity_rps <= 0:
        return CapacityPlan(configuration=configuration, headroom=wanted.headroom, reason=NO_CAPACITY)
    low, high = interval
    flight = in_flight(capacity_rps, latency_mean_ms) if latency_mean_ms else None
    share = 1 - wanted.headroom
    reasons = [] if flight is not None else ["no mean latency at the capacity level: no in-flight target"]
    peak = wanted.peak_rps if wanted.peak_rps and wanted.peak_rps > 0 else None
    replicas = at_low = ceiling = None
    if peak is None:
        reasons.append(NO_PEAK)
    else:
        replicas = replicas_for(peak, capacity_rps, wanted.headroom)
        at_low = replicas_for(peak, low, wanted.headroom) if low else None
        # the user's floor as given; the ceiling reaches what the interval's low end would need
        ceiling = max(replicas, at_low or 0, wanted.min_replicas)
        if price is None:
            reasons.append(NO_PRICE)
    priced = price if replicas is not None else None  # a price is planned with a replica count only
    return CapacityPlan(
        configuration=configuration, headroom=wanted.headroom,
        capacity_rps=_figure(capacity_rps), low_rps=low, high_rps=high, latency_mean_ms=latency_mean_ms,
        in_flight=_figure(flight) if flight is not None else None,
        target_rps_per_replica=_figure(capacity_rps * share),
        target_in_flight_per_replica=_figure(flight * share) if flight is not None else None,
        peak_rps=peak, replicas=replicas, replicas_at_low=at_low,
        min_replicas=wanted.min_replicas if peak is not None else None, max_replicas=ceiling,
        price_per_hour=priced.price_per_hour if priced is not None else None,
        currency=priced.currency if priced is not None else None,
        cost_per_hour=None if priced is None or replicas is None else _figure(replicas * priced.price_per_hour),
        reason="; ".join(reasons) or None,
    )  # fmt: skip


def of_sweep(
    best: SweepBest | None, wanted: CapacitySpec | None, price: CostSpec | None, replicas: int = 1
) -> CapacityPlan:
    """The plan for a sweep's named best (its confirmation's mean and interval when confirmed), measured on
    `replicas` replicas (the template's): the plan is per replica. Without a price of its own, the price its
    trials were measured at (the chart's, on a cluster that prices its nodes)."""
    if best is None:
        return plan(None, None, wanted, price)
    if price is None and best.cost is not None and best.cost.price_per_hour:
        price = CostSpec(price_per_hour=best.cost.price_per_hour, currency=best.cost.currency or "USD")
    low, high = (None if bound is None else bound / replicas for bound in (best.low_rps, best.high_rps))
    return plan(best.capacity_rps / replicas, best.latency_mean_ms, wanted, price, (low, high),
                best.config.label())  # fmt: skip


def of_experiment(document: ExperimentResults, wanted: CapacitySpec | None, price: CostSpec | None) -> CapacityPlan:
    """The plan for a single experiment's best level within the SLO (no interval: one measurement)."""
    best = document.best
    if best is None:
        return plan(None, None, wanted, price)
    level = next((level for level in document.results if level.throughput_rps == best.throughput_rps
                  and level.concurrency == best.concurrency and level.rate_rps == best.rate_rps), None)  # fmt: skip
    # the plan is per replica: a level answered by several divides among them
    replicas = (document.runtime.server_replicas if document.runtime is not None else None) or 1
    return plan(best.throughput_rps / replicas, level.latency_ms.mean if level else None, wanted, price,
                configuration=f"level {best.label}")  # fmt: skip


def _figure(value: float) -> float:
    return float(f"{value:.6g}")


def quantity(value: float) -> str:
    """A Kubernetes quantity: whole numbers as they are, else in thousandths (12.5 -> 12500m); never 0."""
    milli = max(1, round(value * 1000))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _needs_targets(found: CapacityPlan) -> tuple[float, int, int]:
    if found.target_in_flight_per_replica is None or found.max_replicas is None or found.min_replicas is None:
        raise ValueError(f"the plan has no replica count or in-flight target: {found.reason}")
    return found.target_in_flight_per_replica, found.min_replicas, found.max_replicas


def _metadata(name: str, namespace: str | None) -> ObjectMeta:
    return ObjectMeta(name=name, namespace=namespace or None)


def hpa(found: CapacityPlan, name: str, namespace: str | None = None) -> HorizontalPodAutoscaler:
    """An autoscaling/v2 HorizontalPodAutoscaler of Deployment `name` on the per-pod in-flight metric (a
    metrics adapter must serve it), averaging the plan's per-replica target, between its replica bounds."""
    target, low, high = _needs_targets(found)
    return HorizontalPodAutoscaler(
        metadata=_metadata(name, namespace),
        spec=HpaSpec(
            scale_target_ref=ScaleTargetRef(api_version="apps/v1", kind="Deployment", name=name),
            min_replicas=low, max_replicas=high,
            metrics=[PodsMetric(pods=PodsMetricSource(
                metric=MetricIdentifier(name=IN_FLIGHT_METRIC), target=MetricTarget(average_value=quantity(target)),
            ))],
        ),
    )  # fmt: skip


def keda(found: CapacityPlan, name: str, prometheus_url: str | None, namespace: str | None = None) -> ScaledObject:
    """A KEDA ScaledObject of Deployment `name`: a Prometheus trigger on the pods' summed in-flight requests,
    threshold the per-replica target (KEDA divides the query's value by the replicas)."""
    target, low, high = _needs_targets(found)
    query = f'sum({IN_FLIGHT_METRIC}{{pod=~"{name}-.*"}})'
    return ScaledObject(
        metadata=_metadata(name, namespace),
        spec=ScaledObjectSpec(
            scale_target_ref=ScaleTargetRef(name=name), min_replica_count=low, max_replica_count=high,
            triggers=[PrometheusTrigger(metadata=PrometheusTriggerMetadata(
                server_address=prometheus_url or PLACEHOLDER_PROMETHEUS, query=query, threshold=f"{target:g}",
            ))],
        ),
    )  # fmt: skip


def kserve(found: CapacityPlan, name: str) -> InferenceServicePart:
    """An InferenceService's part that sets Knative's concurrency target (per replica) and the replica bounds:
    not an InferenceService by itself (it names no model), but to merge into the one that serves the model;
    so merged, it is valid against KServe's published CRD (tests/k8s/test_crd_on_apiserver.py)."""
    target, low, high = _needs_targets(found)
    annotations = {"autoscaling.knative.dev/metric": "concurrency", "autoscaling.knative.dev/target": f"{target:g}"}
    return InferenceServicePart(
        metadata=ObjectMeta(name=name, annotations=annotations),
        spec=InferenceServiceSpec(predictor=PredictorReplicas(min_replicas=low, max_replicas=high)),
    )


def ray_serve(found: CapacityPlan, name: str) -> RayServeAutoscaling:
    """A Ray Serve deployment's autoscaling_config (to merge under an application's `deployments`):
    target_ongoing_requests the per-replica target; max_ongoing_requests at least the in-flight at capacity
    (Ray's default of 5 would cap a replica below a larger target)."""
    target, low, high = _needs_targets(found)
    ceiling = max(math.ceil(found.in_flight or target), math.ceil(target) + 1)
    return RayServeAutoscaling(deployments=[RayDeployment(
        name=name, max_ongoing_requests=ceiling,
        autoscaling_config=RayAutoscalingConfig(min_replicas=low, max_replicas=high, target_ongoing_requests=target),
    )])  # fmt: skip
