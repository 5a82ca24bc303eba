"""The operator's per-experiment and per-sweep metric series: set when one finishes, gone when it is deleted."""

from __future__ import annotations

from prometheus_client import REGISTRY

from servinglab.api import TrialConfig, parse_experiment
from servinglab.api.cost import NO_PRICE, CostFigures
from servinglab.api.figures import Latency, LatencyIntervals, PercentileInterval
from servinglab.api.results import LevelResult
from servinglab.api.trials import SweepPoint
from servinglab.k8s import metrics
from support.manifests import experiment

SPEC = parse_experiment(experiment("e", server={"batchSize": 4}, load={"concurrency": [1, 8]})).spec
LEVELS = [
    LevelResult(concurrency=1, throughput_rps=10.0, latency_ms=Latency(p99=5.0), requests=100, errors=0),
    LevelResult(concurrency=8, throughput_rps=40.0, latency_ms=Latency(p99=9.0), requests=400, errors=0),
]


def series(name: str, **labels: str) -> list[dict[str, str]]:
    """The label sets of a metric's samples that carry these labels."""
    return [
        sample.labels
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]


def test_a_deleted_experiments_series_are_removed_and_only_its_own() -> None:
    metrics.finished("ns-m", "gone", "Succeeded", SPEC, LEVELS)
    metrics.finished("ns-m", "kept", "Succeeded", SPEC, LEVELS)
    assert len(series("servinglab_experiment_throughput_rps", experiment="gone")) == 2
    assert len(series("servinglab_experiment_latency_p99_ms", experiment="gone")) == 2
    assert len(series("servinglab_experiment_best_throughput_rps", experiment="gone")) == 1

    metrics.forget("ns-m", "gone")
    for name in ("throughput_rps", "latency_p99_ms", "best_throughput_rps"):
        assert series(f"servinglab_experiment_{name}", experiment="gone") == [], name
        assert series(f"servinglab_experiment_{name}", experiment="kept"), name
    metrics.forget("ns-m", "gone")  # a second DELETED (a relist) is harmless
    metrics.forget("ns-m", "never-finished")


def test_a_reapplied_experiment_replaces_its_series_and_a_deleted_sweep_leaves_none() -> None:
    metrics.finished("ns-r", "again", "Succeeded", SPEC, LEVELS)
    metrics.finished("ns-r", "again", "Succeeded", SPEC, LEVELS[:1])
    assert [s["concurrency"] for s in series("servinglab_experiment_throughput_rps", experiment="again")] == ["1"]

    config = TrialConfig(batch_size=4, max_batch_delay_ms=5, workers=1, precision="fp32")
    point = SweepPoint(trial="t1", config=config, level=4, throughput_rps=12.0, p99_latency_ms=8.0)
    metrics.sweep("ns-r", "sw", "tiny", {"Succeeded": 1}, None, [point])
    assert series("servinglab_sweep_front_throughput_rps", sweep="sw")
    metrics.forget_sweep("ns-r", "sw")
    assert series("servinglab_sweep_trials", sweep="sw") == []
    assert series("servinglab_sweep_front_throughput_rps", sweep="sw") == []


def test_cost_and_p99_bounds_are_exported_only_where_a_level_has_them() -> None:
    bounds = LatencyIntervals(p99=PercentileInterval(lower=4.0, upper=6.5, confidence=0.95, samples=400))
    priced = CostFigures(throughput_rps=10.0, price_per_hour=2.0, currency="EUR", cost_per_million=55.5556)
    levels = [
        LevelResult(concurrency=1, throughput_rps=10.0, latency_ms=Latency(p99=5.0, intervals=bounds), requests=400,
                    errors=0, cost=priced),
        LevelResult(concurrency=8, throughput_rps=40.0, latency_ms=Latency(p99=9.0), requests=40, errors=0,
                    cost=CostFigures(throughput_rps=40.0, reason=NO_PRICE)),
    ]  # fmt: skip
    metrics.finished("ns-c", "priced", "Succeeded", SPEC, levels)
    (cost,) = series("servinglab_experiment_cost_per_million", experiment="priced")
    assert cost["concurrency"] == "1" and cost["currency"] == "EUR"  # the unpriced level: no sample, not a 0
    for bound in ("lower", "upper"):
        assert [s["concurrency"] for s in series(f"servinglab_experiment_latency_p99_{bound}_ms", experiment="priced")
                ] == ["1"]  # fmt: skip
    metrics.finished("ns-c", "unpriced", "Succeeded", SPEC, LEVELS)
    assert series("servinglab_experiment_cost_per_million", experiment="unpriced") == []
    metrics.forget("ns-c", "priced")
    assert series("servinglab_experiment_cost_per_million", experiment="priced") == []
    assert series("servinglab_experiment_latency_p99_upper_ms", experiment="priced") == []


def test_a_sweeps_cost_front_is_exported_by_its_p99_bound_and_removed_with_it() -> None:
    config = TrialConfig(batch_size=4, max_batch_delay_ms=5, workers=1, precision="fp32")
    front = [
        SweepPoint(trial="t1", config=config, level=1, throughput_rps=12.0, p99_latency_ms=8.0, cost_per_million=3.0,
                   p99_upper_ms=11.0),
        SweepPoint(trial="t2", config=config, level=4, throughput_rps=30.0, p99_latency_ms=20.0, cost_per_million=1.5),
    ]  # fmt: skip
    metrics.sweep("ns-f", "cheap", "tiny", {"Succeeded": 2}, None, front[:1], front)
    values = {
        (sample.name, sample.labels["trial"]): sample.value
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name.startswith("servinglab_sweep_cost_front_") and sample.labels.get("sweep") == "cheap"
    }
    assert values == {
        ("servinglab_sweep_cost_front_cost_per_million", "t1"): 3.0,
        ("servinglab_sweep_cost_front_p99_bound_ms", "t1"): 11.0,  # the upper bound, not the p99
        ("servinglab_sweep_cost_front_cost_per_million", "t2"): 1.5,
        ("servinglab_sweep_cost_front_p99_bound_ms", "t2"): 20.0,  # no bound: the p99
    }
    metrics.sweep("ns-f", "unpriced", "tiny", {"Succeeded": 2}, None, front[:1], [])
    assert series("servinglab_sweep_cost_front_cost_per_million", sweep="unpriced") == []
    metrics.forget_sweep("ns-f", "cheap")
    assert series("servinglab_sweep_cost_front_cost_per_million", sweep="cheap") == []
