"""The ServingSweep spec: axes, validation that names every bad field, trial names and roll-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servinglab.api import (
    MAX_SPACE,
    SpecError,
    TrialConfig,
    grid,
    load_sweep,
    parse_sweep,
    space_size,
    trial_name,
    trial_spec,
)  # fmt: skip
from servinglab.api.results import ExperimentResults, to_json
from servinglab.api.trials import SweepPoint
from servinglab.sweep import rollup
from support import manifests
from support.paths import EXAMPLES


def document(**spec: Any) -> dict[str, Any]:
    template = {"model": {"name": "resnet50"}, "server": {"workers": 1}, "slo": {"p99LatencyMs": 100}}
    space = {
        "batchSize": {"min": 1, "max": 64},
        "maxBatchDelayMs": {"values": [5, 20]},
        "precision": {"values": ["fp32", "fp16"]},
    }
    return manifests.sweep("resnet50-t4", **{"template": template, "space": space, **spec})


def test_axes_expand_ranges_and_keep_the_template_where_not_varied() -> None:
    sweep = parse_sweep(document())
    assert space_size(sweep.spec) == 7 * 2 * 1 * 2
    configs = grid(sweep.spec)
    assert [c.batch_size for c in configs[:7]] == [1, 2, 4, 8, 16, 32, 64]
    assert {c.workers for c in configs} == {1}
    linear = parse_sweep(document(space={"workers": {"min": 1, "max": 7, "scale": "linear", "step": 3}}))
    assert [c.workers for c in grid(linear.spec)] == [1, 4, 7]
    spec = trial_spec(sweep.spec, configs[-1])
    assert (spec.server.batch_size, spec.server.precision, spec.slo.p99_latency_ms) == (64, "fp16", 100)


def test_every_bad_field_is_named_and_an_oversized_space_is_refused_with_its_count() -> None:
    bad = document(parallelism=0, strategy="random")
    bad["spec"]["space"]["batchSize"] = {"values": [0, 8, 8]}
    bad["spec"]["space"]["workers"] = {"min": 1, "max": 200, "scale": "linear"}
    with pytest.raises(SpecError) as caught:
        parse_sweep(bad)
    problems = "\n".join(caught.value.problems)
    assert "spec.space.batchSize.values[0]: 0 is below the minimum 1" in problems
    assert "spec.space.workers.max: 200 is above the maximum 64" in problems
    assert "spec.parallelism: 0 is below the minimum 1" in problems
    assert "spec.strategy: 'random' is not one of" in problems
    assert str(caught.value).startswith("invalid sweep")
    huge = document(space={"batchSize": {"min": 1, "max": 512, "scale": "linear"}, "workers": {"values": [1, 2]}})
    with pytest.raises(SpecError) as caught:
        parse_sweep(huge)
    assert f"1024 configurations (512 x 1 x 2 x 1 x 1) is more than the {MAX_SPACE}" in str(caught.value)
    with pytest.raises(SpecError, match="strategy list needs configurations"):
        parse_sweep(document(strategy="list"))
    listed = parse_sweep(
        document(
            strategy="list",
            configurations=[{"batchSize": b, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32"} for b in (1, 4)],
        )
    )
    assert space_size(listed.spec) == 2  # a list's size is its length, whatever its axes would expand to


def test_trial_names_are_deterministic_unique_and_fit_an_experiment_name() -> None:
    config = TrialConfig(batch_size=1024, max_batch_delay_ms=60000, workers=64, precision="fp32")
    assert trial_name("resnet50-t4", config) == "resnet50-t4-b1024-d60000-w64-fp32"
    long_a, long_b = "a-very-long-sweep-name-for-a-team-" + "x" * 10, "a-very-long-sweep-name-for-a-team-" + "y" * 10
    name_a, name_b = trial_name(long_a, config), trial_name(long_b, config)
    assert len(name_a) <= 52 and len(name_b) <= 52 and name_a != name_b
    assert name_a == trial_name(long_a, config)


def level(users: int, rps: float, p99: float, errors: int = 0) -> dict[str, Any]:
    return {"concurrency": users, "throughputRps": rps, "latencyMs": {"p99": p99}, "requests": 1000, "errors": errors}


def results(*levels: dict[str, Any], **more: Any) -> ExperimentResults:
    """A trial's results document with these levels."""
    return ExperimentResults.model_validate({"experiment": "trial", "model": "resnet50", "results": levels, **more})


def test_capacity_is_the_best_level_within_the_slo_or_the_peak_rate() -> None:
    measured = results(level(1, 100, 20), level(8, 400, 80), level(32, 600, 140), level(16, 500, 90, errors=3))
    assert rollup.capacity(measured, 100, 0.0) == rollup.Capacity(400, 80, "8 users")
    assert (found := rollup.capacity(measured, 100, 0.01)) is not None and found.capacity_rps == 500  # 0.3 % errors
    assert rollup.capacity(measured, 10, 0.0) is None
    peak = results(level(1, 100, 20), peakRate={"rateRps": 350.0, "p99LatencyMs": 95.0})
    assert (found := rollup.capacity(peak, 100, 0.0)) is not None and found.capacity_rps == 350.0


def test_the_front_keeps_only_points_nothing_beats_on_both_throughput_and_p99() -> None:
    config = TrialConfig(batch_size=1, max_batch_delay_ms=1, workers=1, precision="fp32")
    points = [
        SweepPoint(trial="t", config=config, throughput_rps=r, p99_latency_ms=p)
        for r, p in [(100, 10), (90, 20), (300, 50), (250, 60), (400, 200)]
    ]
    front = rollup.pareto_front(points)
    assert [(p.throughput_rps, p.p99_latency_ms) for p in front] == [(100, 10), (300, 50), (400, 200)]


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("TorchServe exited with code 1; logs ...\ntorch.OutOfMemoryError: CUDA out of memory", "OutOfMemory"),
        ("TorchServe was not ready within 600 s (0/1 workers ready)", "NeverReady"),
        ("TorchServe exited with code 137", "Crashed"),
        ("TorchServe did not apply the requested settings (batchSize, ...)", "SettingsNotApplied"),
        ("something else", "Failed"),
    ],
)
def test_failures_are_classified_into_infeasibility_reasons(message: str, reason: str) -> None:
    assert rollup.classify_failure(message) == reason


def test_the_rollup_counts_trials_prunes_after_an_oom_and_picks_the_best() -> None:
    sweep = parse_sweep(document())
    configs = grid(sweep.spec)
    ok = results(level(8, 400, 80), coldStartSeconds=4.0)
    entries = [
        rollup.record(sweep, trial_name("resnet50-t4", configs[3]), 0, configs[3], ok, None),
        rollup.record(sweep, trial_name("resnet50-t4", configs[5]), 1, configs[5], None, "CUDA out of memory"),
    ]
    result = to_json(rollup.document(sweep, entries, "converged", "2026-11-22T00:00:00Z"))
    assert result["counts"] == {"Succeeded": 1, "Infeasible": 1, "pruned": 2 * 2 - 1, "run": 2}
    assert all(p["reason"] == "implied by OutOfMemory at b32-d5-w1-fp32" for p in result["pruned"])
    assert result["best"]["config"]["batchSize"] == 8 and result["best"]["capacityRps"] == 400
    assert result["trials"][1]["reason"] == "OutOfMemory" and "results" not in result["trials"][0]
    assert result["front"] == [{**result["front"][0], "throughputRps": 400, "p99LatencyMs": 80}]


def test_a_sweep_over_servers_rolls_up_each_servers_best_and_exports_the_winners_own_files() -> None:
    from servinglab.sweep.export import best_files

    sweep = parse_sweep(document(space={"kind": {"values": ["torchserve", "litserve"]},
                                        "batchSize": {"values": [1, 8]}}))  # fmt: skip
    configs = grid(sweep.spec)
    assert [c.kind for c in configs] == ["torchserve", "torchserve", "litserve", "litserve"]
    assert trial_spec(sweep.spec, configs[2]).server.kind == "litserve"
    assert trial_name("resnet50-t4", configs[3]) == "resnet50-t4-litserve-b8-d50-w1-fp32"
    measured = [(configs[0], 300.0), (configs[1], 450.0), (configs[2], 200.0), (configs[3], 500.0)]
    records = [rollup.record(sweep, trial_name("resnet50-t4", c), i, c, results(level(8, rps, 50)), None)
               for i, (c, rps) in enumerate(measured)]  # fmt: skip
    rolled = rollup.document(sweep, records, "done", "2026-11-22T00:00:00Z")
    assert rolled.best is not None and rolled.best.config == configs[3]
    assert [(b.config.kind, b.capacity_rps) for b in rolled.best_per_kind or []] == [
        ("litserve", 500.0), ("torchserve", 450.0)]  # fmt: skip
    assert rolled.space.kind == ["torchserve", "litserve"] and rolled.server_kind == "torchserve"
    winner = best_files(sweep, rolled.best.config)
    assert set(winner) == {"experiment.yaml", "server.py"}, "a LitServe winner exports its own script"
    compile(winner["server.py"], "server.py", "exec")
    assert "max_batch_size=8," in winner["server.py"] and "kind: litserve" in winner["experiment.yaml"]
    runner_up = best_files(sweep, configs[1])
    assert {"config.properties", "model-config.yaml"} <= set(runner_up)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("sweep-*.yaml")), ids=lambda path: path.name)
def test_every_sweep_example_is_valid(path: Path) -> None:
    sweep = load_sweep(path)
    assert grid(sweep.spec), path


def test_a_cluster_trial_keeps_its_server_in_a_label_and_reads_it_back() -> None:
    from servinglab.k8s.sweep.reconcile import config_of, trial_manifest

    servers = parse_sweep(document(space={"kind": {"values": ["torchserve", "litserve"]}, "workers": {"values": [1]}}))
    plain = parse_sweep(document())
    for sweep in (servers, plain):
        for config in grid(sweep.spec)[:2] + grid(sweep.spec)[-2:]:
            child = trial_manifest(sweep, "uid-1", "bench", config, 0)
            assert config_of(child) == config, config
            assert child["spec"]["server"]["kind"] == (config.kind or "torchserve")
            assert (child["metadata"]["labels"].get("servinglab.dev/server-kind") is None) == (config.kind is None)
