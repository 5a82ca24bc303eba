"""Replicas and autoscaling targets from the winner (issue 32, item 2): the replicas a peak rate needs at a
headroom, the in-flight requests by Little's law, the cost per hour, each autoscaler's document, the
`spec.capacity` surface refused with the field named, and the files the sweep's export writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from servinglab.api import SpecError, grid, parse_sweep, trial_name
from servinglab.api.capacity import NO_CAPACITY, NO_PEAK, CapacitySpec
from servinglab.api.cost import CostFigures, CostSpec
from servinglab.api.results import ExperimentResults
from servinglab.api.trials import SweepBest
from servinglab.cli import main
from servinglab.sweep import plan, rollup
from servinglab.sweep.export import best_files
from support import manifests


def sweep_document(**spec: Any) -> dict[str, Any]:
    template = {"model": {"name": "resnet50"}, "server": {"workers": 1}, "slo": {"p99LatencyMs": 100}}
    return manifests.sweep("resnet50-t4", **{"template": template, "space": {"batchSize": {"values": [1, 8]}}, **spec})


# -- the replicas formula at its edges --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("peak", "capacity", "headroom", "replicas"),
    [
        (960.0, 300.0, 0.2, 4),  # exactly 4 x 240: four replicas, each at its target
        (961.0, 300.0, 0.2, 5),  # one rps more: one more replica
        (350.0, 125.0, 0.3, 4),  # 4 x 87.5 exactly (0.7 is not exact in binary)
        (100.0, 100.0, 0.0, 1),
        (101.0, 100.0, 0.0, 2),
        (3.0, 10.0, 0.9, 3),  # 1 - 0.9 is 0.09999999999999998 in binary: exactly 3 replicas' share, not 4
        (1.0, 400.0, 0.9, 1),  # a small peak still needs one replica
        (3601.0, 400.0, 0.9, 91),
    ],
)
def test_replicas_are_the_peak_over_each_replicas_share_rounded_up(
    peak: float, capacity: float, headroom: float, replicas: int
) -> None:
    assert plan.replicas_for(peak, capacity, headroom) == replicas


def test_littles_law_gives_the_requests_in_flight_and_the_targets_at_the_headroom() -> None:
    assert plan.in_flight(400.0, 25.0) == 10.0
    found = plan.plan(400.0, 25.0, CapacitySpec(peak_rps=1000, headroom=0.2), CostSpec(price_per_hour=2.5))
    assert (found.in_flight, found.target_in_flight_per_replica, found.target_rps_per_replica) == (10.0, 8.0, 320.0)
    assert (found.replicas, found.min_replicas, found.max_replicas) == (4, 1, 4)  # 1000 / 320 = 3.125
    assert (found.cost_per_hour, found.currency, found.reason) == (10.0, "USD", None)


def test_a_missing_peak_capacity_price_or_latency_is_a_reason_not_a_number() -> None:
    no_peak = plan.plan(400.0, 25.0, None, None)
    assert no_peak.replicas is None and no_peak.reason == NO_PEAK and no_peak.target_in_flight_per_replica == 8.0
    zero = plan.plan(400.0, 25.0, CapacitySpec.model_construct(peak_rps=0.0, headroom=0.2, min_replicas=1), None)
    assert zero.replicas is None and zero.reason == NO_PEAK
    nothing = plan.plan(None, None, CapacitySpec(peak_rps=100), None)
    assert nothing.replicas is None and nothing.reason == NO_CAPACITY
    unpriced = plan.plan(400.0, 25.0, CapacitySpec(peak_rps=100), None)
    assert unpriced.replicas == 1 and unpriced.cost_per_hour is None and "pricePerHour" in (unpriced.reason or "")
    no_mean = plan.plan(400.0, None, CapacitySpec(peak_rps=100), CostSpec(price_per_hour=1))
    assert no_mean.in_flight is None and no_mean.replicas == 1 and "no mean latency" in (no_mean.reason or "")


def test_a_confirmed_winner_plans_at_its_mean_and_says_what_its_interval_low_end_would_need() -> None:
    sweep = parse_sweep(sweep_document())
    best = SweepBest(trial="t", config=grid(sweep.spec)[1], capacity_rps=300.0, low_rps=250.0, high_rps=360.0,
                     latency_mean_ms=40.0, confidence="Confirmed")  # fmt: skip
    found = plan.of_sweep(best, CapacitySpec(peak_rps=960, headroom=0.2, min_replicas=2), None)
    assert (found.capacity_rps, found.low_rps, found.high_rps) == (300.0, 250.0, 360.0)
    # the autoscalers may go as high as the interval's low end would need
    assert (found.replicas, found.replicas_at_low, found.min_replicas, found.max_replicas) == (4, 5, 2, 5)
    assert found.in_flight == 12.0 and found.configuration == "b8-d50-w1-fp32"


def test_a_winner_measured_on_several_replicas_plans_per_replica_at_the_price_it_was_measured_at() -> None:
    sweep = parse_sweep(sweep_document())
    priced = CostFigures(throughput_rps=600.0, price_per_hour=0.35, currency="EUR", replicas=2)
    best = SweepBest(trial="t", config=grid(sweep.spec)[1], capacity_rps=600.0, low_rps=500.0, high_rps=720.0,
                     latency_mean_ms=40.0, confidence="Confirmed", cost=priced)  # fmt: skip
    found = plan.of_sweep(best, CapacitySpec(peak_rps=960, headroom=0.2), None, replicas=2)
    # two replicas answered 600 rps: one carries 300, so the peak needs 4 of them, as for a one-replica winner
    assert (found.capacity_rps, found.low_rps, found.high_rps, found.replicas) == (300.0, 250.0, 360.0, 4)
    # no template price: the one its trials were measured at (a cluster's chart), per replica
    assert (found.price_per_hour, found.currency, found.cost_per_hour) == (0.35, "EUR", 1.4)


def test_the_users_floor_is_kept_above_what_the_peak_needs() -> None:
    found = plan.plan(400.0, 25.0, CapacitySpec(peak_rps=1000, headroom=0.2, min_replicas=8), None)
    assert (found.replicas, found.min_replicas, found.max_replicas) == (4, 8, 8)


def test_a_winner_that_missed_the_slo_in_every_confirmation_run_exports_no_plan() -> None:
    sweep = parse_sweep(sweep_document(capacity={"peakRps": 960}))
    config = grid(sweep.spec)[1]
    missed = SweepBest(trial="t", config=config, capacity_rps=300.0, latency_mean_ms=40.0, confidence="NoneWithinSlo")
    assert set(best_files(sweep, config, missed)) == set(best_files(sweep, config))  # the configuration alone
    met = missed.model_copy(update={"confidence": "Confirmed"})
    assert {"capacity-plan.yaml", "hpa.yaml"} <= set(best_files(sweep, config, met))


def test_an_experiments_best_level_gives_its_plan() -> None:
    document = ExperimentResults.model_validate({
        "experiment": "x", "model": "tiny", "best": {"concurrency": 8, "throughputRps": 400, "p99LatencyMs": 80},
        "results": [{"concurrency": 1, "throughputRps": 100, "latencyMs": {"p99": 20, "mean": 10}, "requests": 9,
                     "errors": 0},
                    {"concurrency": 8, "throughputRps": 400, "latencyMs": {"p99": 80, "mean": 20}, "requests": 9,
                     "errors": 0}],
    })  # fmt: skip
    found = plan.of_experiment(document, CapacitySpec(peak_rps=640), None)
    assert (found.in_flight, found.replicas, found.configuration) == (8.0, 2, "level 8")


# -- the autoscalers' documents ---------------------------------------------------------------------------

PLANNED = plan.plan(400.0, 31.25, CapacitySpec(peak_rps=1000, headroom=0.2, min_replicas=2), None)  # 12.5 in flight


def test_the_hpa_scales_on_the_per_pod_in_flight_metric_between_the_plans_bounds() -> None:
    assert plan.quantity(10.0) == "10" and plan.quantity(10.0 * 0.8 * 1.25) == "10" and plan.quantity(0.0) == "1m"
    hpa = plan.hpa(PLANNED, "resnet50-t4-best").dumped()
    assert (hpa["apiVersion"], hpa["kind"]) == ("autoscaling/v2", "HorizontalPodAutoscaler")
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "resnet50-t4-best"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 4)
    assert spec["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "servinglab_inflight_requests"}, "target": {"type": "AverageValue", "averageValue": "10"},
    }}]  # fmt: skip
    assert plan.quantity(12.5) == "12500m"


def test_the_keda_scaled_object_has_its_required_fields_with_string_trigger_metadata() -> None:
    found = plan.keda(PLANNED, "resnet50-t4-best", None).dumped()
    assert (found["apiVersion"], found["kind"], found["metadata"]["name"]) == (
        "keda.sh/v1alpha1", "ScaledObject", "resnet50-t4-best")  # fmt: skip
    spec = found["spec"]
    assert spec["scaleTargetRef"] == {"name": "resnet50-t4-best"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 4)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert set(trigger["metadata"]) == {"serverAddress", "query", "threshold"}
    assert all(isinstance(value, str) for value in trigger["metadata"].values()), "KEDA takes strings only"
    assert (
        trigger["metadata"]["threshold"] == "10" and trigger["metadata"]["serverAddress"] == plan.PLACEHOLDER_PROMETHEUS
    )
    assert "servinglab_inflight_requests" in trigger["metadata"]["query"]
    named = plan.keda(PLANNED, "x", "http://prom.example:9090").dumped()
    assert named["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://prom.example:9090"


def test_kserve_gets_knatives_concurrency_target_and_ray_serve_its_ongoing_requests() -> None:
    service = plan.kserve(PLANNED, "resnet50-t4-best").dumped()
    assert (service["apiVersion"], service["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    assert service["metadata"]["annotations"] == {
        "autoscaling.knative.dev/metric": "concurrency", "autoscaling.knative.dev/target": "10"}  # fmt: skip
    assert service["spec"]["predictor"] == {"minReplicas": 2, "maxReplicas": 4}
    (deployment,) = plan.ray_serve(PLANNED, "resnet50-t4-best").dumped()["deployments"]
    assert deployment["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 4, "target_ongoing_requests": 10.0}
    assert deployment["max_ongoing_requests"] == 13, "room for the in-flight at capacity (12.5), above the target"
    with pytest.raises(ValueError, match="no replica count"):
        plan.hpa(plan.plan(400.0, 25.0, None, None), "x")


# -- the spec surface and the export ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacity", "named"),
    [({"peakRps": 0}, "spec.capacity.peakRps"), ({"peakRps": -5}, "spec.capacity.peakRps"),
     ({"peakRps": 100, "headroom": 0.95}, "spec.capacity.headroom"),
     ({"peakRps": 100, "headroom": -0.1}, "spec.capacity.headroom"),
     ({"peakRps": 100, "minReplicas": 0}, "spec.capacity.minReplicas"),
     ({"peakRps": 100, "replicas": 3}, "spec.capacity.replicas")],
)  # fmt: skip
def test_a_bad_capacity_is_refused_naming_the_field(capacity: dict[str, Any], named: str) -> None:
    with pytest.raises(SpecError, match=named.replace(".", r"\.")):
        parse_sweep(sweep_document(capacity=capacity))


def test_validate_names_the_bad_capacity_field(tmp_path: Path) -> None:
    bad = tmp_path / "sweep.yaml"
    bad.write_text(yaml.safe_dump(sweep_document(capacity={"peakRps": 100, "headroom": 0.95})))
    result = CliRunner().invoke(main, ["validate", str(bad)])
    assert result.exit_code != 0 and "spec.capacity.headroom" in result.output, result.output
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(sweep_document(capacity={"peakRps": 960})))
    assert CliRunner().invoke(main, ["validate", str(good)]).exit_code == 0
    assert parse_sweep(sweep_document(capacity={"peakRps": 960})).spec.capacity == CapacitySpec(peak_rps=960)


def results(rps: float, mean: float) -> ExperimentResults:
    level = {"concurrency": 8, "throughputRps": rps, "latencyMs": {"p99": 80, "mean": mean}, "requests": 900,
             "errors": 0}  # fmt: skip
    return ExperimentResults.model_validate({"experiment": "trial", "model": "resnet50", "results": [level]})


def test_the_export_writes_the_plan_and_each_autoscalers_document_beside_the_winners_files() -> None:
    sweep = parse_sweep(sweep_document(
        capacity={"peakRps": 960}, template={"model": {"name": "resnet50"}, "server": {"workers": 1},
                                             "slo": {"p99LatencyMs": 100}, "cost": {"pricePerHour": 1.5},
                                             "metrics": {"prometheusUrl": "http://prom.example:9090"}},
    ))  # fmt: skip
    configs = grid(sweep.spec)
    records = [rollup.record(sweep, trial_name("resnet50-t4", c), i, c, results(rps, 40.0), None)
               for i, (c, rps) in enumerate([(configs[0], 200.0), (configs[1], 300.0)])]  # fmt: skip
    rolled = rollup.document(sweep, records, "done", "2026-11-22T00:00:00Z")
    assert rolled.best is not None and rolled.best.latency_mean_ms == 40.0
    files = best_files(sweep, rolled.best.config, rolled.best)
    planned = {"capacity-plan.yaml", "hpa.yaml", "keda-scaledobject.yaml", "kserve-inferenceservice.yaml",
               "ray-serve-autoscaling.yaml"}  # fmt: skip
    assert planned <= set(files)
    written = yaml.safe_load(files["capacity-plan.yaml"])
    assert (written["replicas"], written["inFlight"], written["costPerHour"]) == (4, 12.0, 6.0)
    hpa = yaml.safe_load(files["hpa.yaml"])
    assert hpa["metadata"]["name"] == "resnet50-t4-best" and hpa["spec"]["maxReplicas"] == 4
    keda = yaml.safe_load(files["keda-scaledobject.yaml"])
    assert keda["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://prom.example:9090"
    # without a peak rate: the plan says why, and no autoscaler document is written
    unplanned = parse_sweep(sweep_document())
    alone = best_files(unplanned, rolled.best.config, rolled.best)
    assert planned & set(alone) == {"capacity-plan.yaml"}
    assert yaml.safe_load(alone["capacity-plan.yaml"])["reason"] == NO_PEAK
