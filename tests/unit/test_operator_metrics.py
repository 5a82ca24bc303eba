"""The operator's per-experiment and per-sweep metric series: set when one finishes, gone when it is deleted."""

from __future__ import annotations

from prometheus_client import REGISTRY

from servinglab.api import TrialConfig, parse_experiment
from servinglab.api.results import Latency, LevelResult
from servinglab.api.trials import SweepPoint
from servinglab.k8s import metrics

SPEC = parse_experiment(
    {"apiVersion": "servinglab.dev/v1alpha1", "kind": "ServingExperiment", "metadata": {"name": "e"},
     "spec": {"model": {"name": "tiny"}, "server": {"batchSize": 4}, "load": {"concurrency": [1, 8]}}}
).spec  # fmt: skip
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
