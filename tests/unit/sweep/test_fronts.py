"""A sweep's cost front (cost per million against p99's upper bound): which points it keeps, that it ranks
by the bound, that an unpriced sweep has none (and says why), and that it reaches the document and the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servinglab.api import TrialConfig, grid, parse_sweep, trial_name
from servinglab.api.results import ExperimentResults
from servinglab.api.trials import SweepPoint
from servinglab.present.sweep_report import PLOTS, render_sweep
from servinglab.sweep import fronts, rollup
from support import manifests

CONFIG = TrialConfig(batch_size=1, max_batch_delay_ms=1, workers=1, precision="fp32")


def point(trial: str, rps: float, p99: float, cost: float | None, upper: float | None = None) -> SweepPoint:
    return SweepPoint(trial=trial, config=CONFIG, throughput_rps=rps, p99_latency_ms=p99, cost_per_million=cost,
                      p99_lower_ms=p99 * 0.9 if upper is not None else None, p99_upper_ms=upper)  # fmt: skip


def test_the_cost_front_differs_from_the_throughput_front() -> None:
    # b is the fastest at p99 30 but dear (more replicas' worth of price for its rate); c is cheaper at p99 40
    candidates = [point("a", 100, 10, 5.0), point("b", 400, 30, 4.0), point("c", 300, 40, 2.0),
                  point("d", 350, 60, 3.0), point("e", 50, 50, 9.0)]  # fmt: skip
    assert [p.trial for p in fronts.pareto_front(candidates)] == ["a", "b"]
    cheapest, reason = fronts.cost_front(candidates)
    assert reason is None and cheapest is not None
    assert [p.trial for p in cheapest] == ["a", "b", "c"]  # d: dearer than c at a worse p99; e: worse on both


def test_the_cost_front_ranks_by_the_p99s_upper_bound() -> None:
    # lucky: a short run measured p99 5 ms, but all it can promise is 50 ms; steady: 10 ms, bounded at 12
    lucky, steady = point("lucky", 100, 5, 1.0, upper=50), point("steady", 100, 10, 0.9, upper=12)
    cheapest, _ = fronts.cost_front([lucky, steady])
    assert [p.trial for p in cheapest or []] == ["steady"]
    assert [p.trial for p in fronts.pareto_front([lucky, steady])] == ["lucky"]  # the throughput front: the p99
    # without a bound the p99 itself is what it is ranked by
    unbounded = point("unbounded", 100, 5, 1.0)
    assert [p.trial for p in fronts.cost_front([unbounded, steady])[0] or []] == ["unbounded", "steady"]


def test_no_priced_point_no_cost_front_and_a_reason() -> None:
    assert fronts.cost_front([point("a", 100, 10, None)]) == (None, fronts.NOTHING_PRICED)
    assert "pricePerHour" in fronts.NOTHING_PRICED
    assert fronts.cost_front([]) == (None, fronts.NOTHING_MEASURED)


def sweep_document(price: float | None) -> dict[str, Any]:
    template: dict[str, Any] = {"model": {"name": "resnet50"}, "server": {"workers": 1}, "slo": {"p99LatencyMs": 100}}
    if price is not None:
        template["cost"] = {"pricePerHour": price, "currency": "EUR"}
    return manifests.sweep("fronts", template=template, space={"batchSize": {"values": [1, 8]}})


def level(users: int, rps: float, p99: float, upper: float | None, price: float | None) -> dict[str, Any]:
    interval = {"lower": p99 * 0.9, "upper": upper, "confidence": 0.95, "samples": 1000}
    cost = {"throughputRps": rps, "pricePerHour": price, "costPerMillion": price / (rps * 3600) * 1e6} if price else {
        "throughputRps": rps, "reason": "no price"}  # fmt: skip
    return {"concurrency": users, "throughputRps": rps, "requests": 1000, "errors": 0, "cost": cost,
            "latencyMs": {"p99": p99, "intervals": {"p99": interval}}}  # fmt: skip


def rolled(price: float | None) -> Any:
    sweep = parse_sweep(sweep_document(price))
    configs = grid(sweep.spec)
    measured = [
        [level(1, 100, 10, 11, price), level(8, 300, 40, 200, price)],  # the second: a loose bound
        [level(1, 150, 20, 22, price), level(8, 250, 60, 65, price)],
    ]
    documents = [ExperimentResults.model_validate({"experiment": "t", "model": "resnet50", "results": levels})
                 for levels in measured]  # fmt: skip
    records = [rollup.record(sweep, trial_name("fronts", config), index, config, found, None)
               for index, (config, found) in enumerate(zip(configs, documents, strict=True))]  # fmt: skip
    return rollup.document(sweep, records, "done", "2026-11-27T00:00:00Z")


def test_the_rollup_carries_the_cost_front_and_each_points_bounds() -> None:
    document = rolled(3.6)
    assert {(p.p99_latency_ms, p.p99_upper_ms) for p in document.points} == {(10, 11), (40, 200), (20, 22), (60, 65)}
    assert document.cost_front_reason is None and document.cost_front is not None
    # by upper bound; 250 rps at p99 60 stays: by the p99 alone the cheaper 300 rps at p99 40 would beat it,
    # but all that p99 promises is 200 ms
    assert [(p.throughput_rps, p.p99_bound_ms) for p in document.cost_front] == [(100, 11), (150, 22), (250, 65),
                                                                                   (300, 200)]  # fmt: skip
    assert [(p.throughput_rps, p.p99_latency_ms) for p in document.front] == [(100, 10), (150, 20), (300, 40)]
    unpriced = rolled(None)
    assert unpriced.cost_front is None and unpriced.cost_front_reason == fronts.NOTHING_PRICED
    assert "costFront" not in unpriced.model_dump(by_alias=True, exclude_none=True)  # absent, not zeros


def test_the_sweep_report_draws_the_cost_front_and_lists_it_with_p99_intervals(tmp_path: Path) -> None:
    document = rolled(3.6)
    page = render_sweep(document, tmp_path / "priced").read_text()
    assert "cost_front.png" in PLOTS and all((tmp_path / "priced" / name).stat().st_size > 0 for name in PLOTS)
    table = page[page.index('<table id="cost-front">') :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 1 + len(document.cost_front)  # the header and one row per front point
    assert "40.0 [36.0, 200.0]" in table and "10.0 [9.0, 11.0]" in table  # p99 [lower, upper]
    assert f'<img src="{PLOTS[2]}"' in page
    unpriced = render_sweep(rolled(None), tmp_path / "unpriced").read_text()
    assert '<p id="cost-front">No cost front: no measured point has a cost per million' in unpriced
    assert (tmp_path / "unpriced" / PLOTS[2]).stat().st_size > 0  # the page's image is there, saying why
