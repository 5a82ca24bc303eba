"""Several server replicas (spec.server.replicas) and the experiment that checks a capacity plan by running it:
the field's bounds, the Deployment and the cost of N replicas, the local runner's refusal, and the exported
plan check (the winner on the plan's replicas under a step to the planned peak, the same SLO)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from servinglab import servers
from servinglab.api import SpecError, grid, parse_experiment, parse_sweep, trial_name
from servinglab.api.capacity import CapacitySpec
from servinglab.api.cost import CostSpec, cost_figures
from servinglab.api.results import ExperimentResults, LevelResult
from servinglab.k8s import builders
from servinglab.k8s.experiment.diagnose import replaced_server
from servinglab.servers.base import PodInputs
from servinglab.sweep import plan, plancheck, rollup
from servinglab.sweep.export import best_files
from support import manifests

OWNER = builders.Owner("check", "bench", "uid-1")


def experiment(**server: Any) -> dict[str, Any]:
    return manifests.experiment("check", server={"gpus": 0, **server}, slo={"p99LatencyMs": 100})


@pytest.mark.parametrize("replicas", [0, 33, "two"])
def test_a_bad_replica_count_is_refused_naming_the_field(replicas: Any) -> None:
    with pytest.raises(SpecError, match=r"server\.replicas") as refused:
        parse_experiment(experiment(replicas=replicas))
    assert str(replicas) in str(refused.value)


def test_the_deployment_runs_the_replicas_asked_for_and_one_by_default() -> None:
    for asked, runs in ((None, 1), (3, 3)):
        spec = parse_experiment(experiment(**({"replicas": asked} if asked else {}))).spec
        pod = servers.get(spec.server.kind).pod(spec, PodInputs(builders.Names(OWNER.name).config, "img:1"))
        assert builders.deployment(OWNER, spec, pod)["spec"]["replicas"] == runs


def test_the_whole_deployment_is_priced_per_replica() -> None:
    one = cost_figures(CostSpec(price_per_hour=3.6), 100.0, 1)
    three = cost_figures(CostSpec(price_per_hour=3.6), 100.0, 1, replicas=3)
    assert (one.cost_per_million, one.gpu_seconds_per_thousand, one.replicas) == (10.0, 10.0, None)
    assert (three.cost_per_million, three.gpu_seconds_per_thousand, three.replicas) == (30.0, 30.0, 3)


def test_a_replica_gone_during_the_load_is_named_whichever_it_is() -> None:
    pods = [{"metadata": {"name": name}} for name in ("s-a", "s-c")]
    assert replaced_server(pods, ["s-a", "s-c"]) is None
    assert str(replaced_server(pods, ["s-a", "s-b"])).startswith("server pod s-b was deleted during the load test")


def test_a_local_run_of_several_replicas_is_refused_before_any_server_starts(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(experiment(replicas=2)))
    # the CLI in its own process: the local runner patches the standard library with gevent on import
    ran = subprocess.run([sys.executable, "-m", "servinglab", "run", "two.yaml"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert ran.returncode != 0
    assert "server.replicas: 2; a local run serves from one server" in ran.stderr + ran.stdout, ran.stderr
    assert "Starting" not in ran.stderr + ran.stdout


def winner(peak: float = 960.0) -> tuple[Any, Any]:
    sweep = parse_sweep(manifests.sweep(
        "tiny-cpu",
        template={"model": {"name": "tiny"}, "server": {"gpus": 0, "workers": 1},
                  "load": {"mode": "open", "rates": [10]}, "slo": {"p99LatencyMs": 100}},
        space={"batchSize": {"values": [1, 8]}}, capacity={"peakRps": peak, "headroom": 0.2},
    ))  # fmt: skip
    configs = grid(sweep.spec)
    level = {"rateRps": 300, "throughputRps": 300.0, "latencyMs": {"p99": 80, "mean": 40}, "requests": 9000,
             "errors": 0}  # fmt: skip
    records = [rollup.record(sweep, trial_name("tiny-cpu", c), i, c, ExperimentResults.model_validate(
        {"experiment": "t", "model": "tiny", "results": [{**level, "throughputRps": rps}]}), None)
        for i, (c, rps) in enumerate([(configs[0], 200.0), (configs[1], 300.0)])]  # fmt: skip
    rolled = rollup.document(sweep, records, "done", "2026-11-22T00:00:00Z")
    assert rolled.best is not None
    return sweep, rolled.best


def test_the_export_writes_the_experiment_that_checks_the_plan_at_its_peak() -> None:
    sweep, best = winner()
    files = best_files(sweep, best.config, best)
    check = parse_experiment(yaml.safe_load(files[plancheck.CHECK_FILE]))  # ready to apply: valid as it is
    assert check.metadata.name == "tiny-cpu-check"
    server, load = check.spec.server, check.spec.load
    # the winner (batch 8, 300 rps) on ceil(960 / (300 x 0.8)) = 4 replicas
    assert (server.batch_size, server.replicas) == (8, 4)
    assert load.mode == "open" and load.shape is not None and load.shape.step is not None
    assert load.shape.step.rates == [480.0, 960.0]  # rising to the peak, then holding it
    assert load.rates == [] and load.rate_search is None
    assert check.spec.slo.p99_latency_ms == 100


def test_the_peak_step_holds_long_enough_for_a_p99_bound() -> None:
    found = plan.plan(20.0, 10.0, CapacitySpec(peak_rps=26.0, headroom=0.3), None)
    spec = parse_experiment(experiment()).spec
    checked = plancheck.check_spec(spec, found)
    step = checked.load.shape.step if checked.load.shape else None
    assert found.replicas == 2 and checked.server.replicas == 2
    assert step is not None and step.step_seconds * 26.0 >= 1.5 * 299  # 299 samples bound a p99 at 95 %
    assert plancheck.check_spec(spec, found, replicas=1).server.replicas == 1  # one below the plan


def test_a_plan_without_a_count_or_a_spec_without_an_slo_has_no_check() -> None:
    spec = parse_experiment(experiment()).spec
    with pytest.raises(ValueError, match="no replica count"):
        plancheck.check_spec(spec, plan.plan(20.0, 10.0, CapacitySpec(), None))
    unjudged = spec.model_copy(update={"slo": spec.slo.model_copy(update={"p99_latency_ms": None})})
    with pytest.raises(ValueError, match=r"slo\.p99LatencyMs"):
        plancheck.check_spec(unjudged, plan.plan(20.0, 10.0, CapacitySpec(peak_rps=26.0), None))


def shaped(peak_p99: float, errors: int = 0, meets: bool = True) -> LevelResult:
    phases = [{"name": "step 1", "rateRps": 13, "seconds": 23, "requests": 300, "errors": 0, "throughputRps": 13,
               "latencyMs": {"p99": 20}},
              {"name": "step 2", "rateRps": 26, "seconds": 23, "requests": 600, "errors": errors,
               "throughputRps": 26, "latencyMs": {"p99": peak_p99}}]  # fmt: skip
    return LevelResult.model_validate({"rateRps": 26, "throughputRps": 20, "requests": 900, "errors": errors,
                                       "phases": phases, "meetsSlo": meets})  # fmt: skip


def test_the_check_is_judged_at_its_peak_step() -> None:
    assert plancheck.verdict(shaped(80.0), 100.0) == (True, 80.0)
    assert plancheck.verdict(shaped(400.0, meets=False), 100.0) == (False, 400.0)
    assert plancheck.verdict(shaped(80.0, errors=3), 100.0)[0] is False
    assert plancheck.verdict(shaped(80.0, meets=False), 100.0)[0] is False  # the run's own p99 bound missed it


def test_the_written_check_is_yaml_a_cluster_would_take(tmp_path: Path) -> None:
    sweep, best = winner(peak=500.0)
    text = best_files(sweep, best.config, best)[plancheck.CHECK_FILE]
    assert text.startswith("# Checks the capacity plan of sweep tiny-cpu: 3 replicas")
    (tmp_path / "check.yaml").write_text(text)
    assert yaml.safe_load(text)["spec"]["server"]["replicas"] == 3
