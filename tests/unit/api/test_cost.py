"""Cost (issue 32, item 1): each level's cost per million inferences at its measured throughput, its
GPU-seconds per thousand and energy per inference; absent with a reason (never 0) without a price; the
command line's price overriding the spec's; and a sweep that optimises cost within the SLO."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from servinglab.api import ExperimentSpec, ServingSweep, SpecError, SweepSpec, TrialConfig, load_experiment, parse_sweep
from servinglab.api.cost import NO_PRICE, CostSpec, cost_figures
from servinglab.api.figures import GpuFigures, Latency
from servinglab.api.meta import GROUP_VERSION, SWEEP_KIND, ObjectMeta
from servinglab.api.results import LevelResult, Runtime
from servinglab.api.trials import SUCCEEDED, TrialRecord
from servinglab.cli import main
from servinglab.measure.document import experiment_results
from servinglab.sweep import confirm, rollup
from servinglab.sweep.search import Outcome, best
from support import manifests


def level(users: int, rps: float, p99: float, energy: float | None = None) -> LevelResult:
    gpu = GpuFigures(energy_per_inference_joules=energy) if energy is not None else None
    return LevelResult(concurrency=users, throughput_rps=rps, latency_ms=Latency(p99=p99), requests=1000, errors=0,
                       gpu=gpu)  # fmt: skip


def spec(cost: dict[str, object] | None = None, gpus: int = 1) -> ExperimentSpec:
    document: dict[str, object] = {"model": {"name": "tiny"}, "server": {"gpus": gpus}, "slo": {"p99LatencyMs": 50}}
    return ExperimentSpec.model_validate({**document, **({"cost": cost} if cost else {})})


LEVELS = [level(1, 100.0, 10.0, energy=2.5), level(4, 200.0, 40.0, energy=1.5), level(16, 400.0, 90.0)]


def test_a_priced_run_gives_each_level_and_the_best_their_cost_at_the_measured_throughput() -> None:
    document = experiment_results(
        "x", spec({"pricePerHour": 0.72}), LEVELS, runtime=Runtime(mode="local", device="cuda")
    )
    costs = [found.cost for found in document.results]
    assert all(cost is not None and cost.reason is None and cost.currency == "USD" for cost in costs)
    # 0.72 per hour over 100 rps x 3600 s = 360 000 inferences an hour: 2.00 per million
    assert [c.cost_per_million for c in costs if c] == [2.0, 1.0, 0.5]
    assert [c.gpu_seconds_per_thousand for c in costs if c] == [10.0, 5.0, 2.5]
    assert [c.energy_per_inference_joules for c in costs if c] == [2.5, 1.5, None]
    # the best level within the SLO (200 rps at 40 ms; 400 rps misses 50 ms) carries its cost
    assert document.best is not None and document.best.cost is not None
    assert (document.best.throughput_rps, document.best.cost.cost_per_million) == (200.0, 1.0)


def test_an_unpriced_run_says_why_its_cost_is_absent_never_zero() -> None:
    document = experiment_results("x", spec(), LEVELS, runtime=Runtime(mode="local", device="cuda"))
    for found in document.results:
        assert found.cost is not None and found.cost.cost_per_million is None and found.cost.reason == NO_PRICE
        assert found.cost.gpu_seconds_per_thousand  # needs no price
    on_cpu = experiment_results("x", spec(), LEVELS, runtime=Runtime(mode="local", device="cpu"))
    assert all(f.cost is not None and f.cost.gpu_seconds_per_thousand is None for f in on_cpu.results)
    nothing = cost_figures(CostSpec(price_per_hour=1.0), 0.0, 1)
    assert nothing.cost_per_million is None and nothing.reason and "no throughput" in nothing.reason


def experiment_document(cost: dict[str, object]) -> dict[str, object]:
    return manifests.experiment("e", cost=cost)


@pytest.mark.parametrize(
    ("cost", "named"),
    [({"pricePerHour": 0}, "cost.pricePerHour"), ({"pricePerHour": 1e9}, "cost.pricePerHour"),
     ({"pricePerHour": 1, "currency": "dollars"}, "cost.currency")],
)  # fmt: skip
def test_a_bad_price_is_refused_naming_the_field(cost: dict[str, object], named: str, tmp_path: Path) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(experiment_document(cost)))
    with pytest.raises(SpecError, match=named.replace(".", r"\.")):
        load_experiment(path)


def sweep_document(optimize: str, cost: dict[str, object] | None = None) -> dict[str, object]:
    template: dict[str, object] = {"model": {"name": "tiny"}, **({"cost": cost} if cost else {})}
    return manifests.sweep("s", template=template, strategy="grid", objective={"optimize": optimize},
                           space={"batchSize": {"values": [1, 4]}})  # fmt: skip


def test_the_command_line_price_overrides_the_spec_and_reaches_the_results(tmp_path: Path) -> None:
    experiment = tmp_path / "e.yaml"
    experiment.write_text(yaml.safe_dump(experiment_document({"pricePerHour": 9.0, "currency": "EUR"})))
    parsed = load_experiment(experiment, 0.36)
    assert parsed.spec.cost == CostSpec(price_per_hour=0.36, currency="EUR")
    document = experiment_results("e", parsed.spec, LEVELS[:1], runtime=Runtime(mode="local", device="cuda"))
    assert document.results[0].cost is not None and document.results[0].cost.cost_per_million == 1.0
    runner = CliRunner()
    refused = runner.invoke(main, ["validate", str(experiment), "--price-per-hour", "0"])
    assert refused.exit_code != 0 and "--price-per-hour" in refused.output
    # a sweep that optimises cost needs a price: the spec's, or the command line's
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump(sweep_document("cost")))
    unpriced = runner.invoke(main, ["validate", str(sweep)])
    assert unpriced.exit_code == 1 and "template.cost.pricePerHour" in unpriced.output
    priced = runner.invoke(main, ["validate", str(sweep), "--price-per-hour", "0.5"])
    assert priced.exit_code == 0, priced.output
    # an operator whose chart prices its nodes prices each trial where it runs: no template price needed there
    assert parse_sweep(sweep_document("cost"), prices_elsewhere=True).spec.objective.optimize == "cost"
    with pytest.raises(SpecError, match="the chart's pricing"):
        parse_sweep(sweep_document("cost"))


def record(order: int, batch: int, rps: float, price: float, gpus: int) -> TrialRecord:
    """A trial whose replica costs `price` an hour (a bigger replica: more GPUs, more money, more throughput)."""
    config = TrialConfig(batch_size=batch, max_batch_delay_ms=5, workers=1, precision="fp32")
    return TrialRecord(name=f"s-b{batch}", order=order, config=config, state=SUCCEEDED, capacity_rps=rps,
                       cost=cost_figures(CostSpec(price_per_hour=price), rps, gpus))  # fmt: skip


# the big replica serves more (120 rps) but costs 3x as much: 2.78 per million against the small one's 1.39
RECORDS = [record(0, 4, 120.0, 1.2, 2), record(1, 1, 80.0, 0.4, 1)]


def sweep_of(optimize: str, rounds: int = 0) -> ServingSweep:
    spec = SweepSpec.model_validate({**sweep_document(optimize, {"pricePerHour": 0.4})["spec"],  # type: ignore[dict-item]
                                     "confirm": {"candidates": 2, "rounds": rounds}})  # fmt: skip
    return ServingSweep(api_version=GROUP_VERSION, kind=SWEEP_KIND, metadata=ObjectMeta(name="s"),
                        spec=spec)  # fmt: skip


@pytest.mark.parametrize(("optimize", "winner"), [("throughput", "s-b4"), ("cost", "s-b1")])
def test_a_cost_objective_picks_the_cheapest_per_inference_within_the_slo(optimize: str, winner: str) -> None:
    sweep = sweep_of(optimize)
    document = rollup.document(sweep, RECORDS, "done", "t0")
    assert document.best is not None and document.best.trial == winner
    assert document.best.cost is not None and document.best.cost.cost_per_million
    assert document.objective.optimize == optimize
    # the search ranks the same way
    history: list[Outcome] = [rollup.outcome(r, sweep.spec.objective) for r in RECORDS]
    found = best(history)
    assert found is not None and found.config == next(r.config for r in RECORDS if r.name == winner)
    # and the confirmation: each run at the same capacity as its first measurement, clearly apart
    confirming = sweep_of(optimize, rounds=3)
    runs = [r.model_copy(update={"name": f"{r.name}-r{n}", "confirms": r.name, "round": n,
                                 "capacity_rps": (r.capacity_rps or 0) * (1 + 0.01 * n)})
            for n in (1, 2, 3) for r in RECORDS]  # fmt: skip
    decided = confirm.decide(confirming.spec, RECORDS, runs)
    assert decided is not None and (decided.state, decided.winner) == ("Confirmed", winner)
    named = rollup.document(confirming, RECORDS, "done", "t0", runs).best
    assert named is not None and named.trial == winner and named.cost is not None
    # the winner's cost is at its confirmed mean capacity
    assert named.cost.throughput_rps == named.capacity_rps
