"""The load that holds a utilisation: the bounded search over fake servers whose utilisation curve is known
(reached; a plateau is the server's limit; the SLO or the generator stop it first; probes, time and load are
bounded), the spec's refusals naming the field, the cluster's refusal, and how the answer is told."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from servinglab.api import SpecError, parse_experiment
from servinglab.api.figures import GeneratorVerdict, Latency
from servinglab.api.results import ExperimentResults
from servinglab.api.utilisation import NeverReached, UtilisationTargetSpec
from servinglab.k8s.experiment import snapshot
from servinglab.k8s.experiment.diagnose import cluster_problems
from servinglab.loadgen.stats import LevelStats
from servinglab.loadgen.utilisation import Probe, Reading, hold_utilisation, search_utilisation
from servinglab.present.tables import notes
from support import manifests


def stats(load: float, closed: bool, p99: float = 10.0, saturated: bool = False) -> LevelStats:
    return LevelStats(
        concurrency=int(load) if closed else None, rate_rps=None if closed else load, requests=100, errors=0,
        errors_by_kind={}, throughput_rps=load * 10, window_seconds=10.0, latency_ms=Latency(p50=p99 / 2, p99=p99),
        generator=GeneratorVerdict(saturated=saturated, reason="cpu 97%" if saturated else None),
    )  # fmt: skip


Curve = Callable[[float], float | None]


def server(
    curve: Curve,
    closed: bool = True,
    saturated_from: float = float("inf"),
    p99: Callable[[float], float] = lambda _: 10,
) -> tuple[Callable[[float], Probe], list[float]]:
    """A probe of a fake server whose utilisation at each load is `curve(load)`; and the loads it was offered."""
    offered: list[float] = []

    def probe(load: float) -> Probe:
        offered.append(load)
        return Probe(stats(load, closed, p99(load), load >= saturated_from), curve(load), len(offered) - 1)

    return probe, offered


def aim(**fields: Any) -> UtilisationTargetSpec:
    return UtilisationTargetSpec.model_validate({"target": 0.6, "tolerance": 0.05, **fields})


def within(slo_ms: float) -> Callable[[LevelStats], bool]:
    return lambda level: (level.latency_ms.p99 or 0.0) <= slo_ms


ALWAYS = within(float("inf"))


def test_users_double_until_the_target_is_bracketed_then_the_bracket_lands_on_it() -> None:
    probe, offered = server(lambda users: 0.1 * users)
    summary, landed = search_utilisation(probe, aim(), "cpu", True, ALWAYS)
    assert offered == [1, 2, 4, 8, 6], "doubled to 8 (0.8, over the band), then interpolated between 4 and 8"
    assert summary.reached and summary.reason is None and landed is not None
    assert (summary.concurrency, summary.utilisation, summary.level_index, summary.probes) == (6, 0.6, 4, 5)
    assert summary.throughput_rps == 60 and summary.latency_ms == {"p50": 5.0, "p99": 10.0}
    assert [step.utilisation for step in summary.steps] == [0.1, 0.2, 0.4, 0.8, 0.6]


def test_an_open_loop_raises_its_rate_from_start() -> None:
    probe, offered = server(lambda rate: rate / 100, closed=False)
    summary, _ = search_utilisation(probe, aim(target=0.3, start=5), "gpu", False, ALWAYS)
    assert offered == [5, 10, 20, 40, 30] and summary.reached
    assert (summary.rate_rps, summary.concurrency, summary.resource) == (30, None, "gpu")


def test_a_utilisation_that_stays_flat_while_the_load_doubles_is_the_servers_limit() -> None:
    probe, offered = server(lambda users: min(0.1 * users, 0.35))
    summary, landed = search_utilisation(probe, aim(), "cpu", True, ALWAYS)
    assert offered == [1, 2, 4, 8] and landed is None
    assert (summary.reached, summary.reason) == (False, NeverReached.SERVER_LIMIT)
    assert "c=4 to c=8" in (summary.note or "")


@pytest.mark.parametrize(
    ("saturated_from", "slo", "reason", "probes"),
    [
        (4, float("inf"), NeverReached.GENERATOR, 3),  # the generator gave out at 4 users
        (float("inf"), 35.0, NeverReached.SLO, 3),  # p99 = 10 ms x users: 40 ms at 4 users, utilisation 0.4
    ],
)
def test_the_generator_or_the_slo_stop_the_search_before_the_target(
    saturated_from: float, slo: float, reason: NeverReached, probes: int
) -> None:
    probe, offered = server(lambda users: 0.1 * users, saturated_from=saturated_from, p99=lambda users: 10.0 * users)
    summary, _ = search_utilisation(probe, aim(), "cpu", True, within(slo))
    assert (summary.reached, summary.reason, summary.probes, offered) == (False, reason, probes, [1, 2, 4])
    assert summary.steps[-1].meets_slo is (reason != NeverReached.SLO)
    assert summary.steps[-1].generator_saturated is (reason == NeverReached.GENERATOR)


def test_a_broken_slo_over_the_band_only_narrows_the_bracket() -> None:
    probe, offered = server(lambda users: 0.1 * users, p99=lambda users: 10.0 * users)
    summary, _ = search_utilisation(probe, aim(), "cpu", True, within(70.0))
    assert summary.reached and offered == [1, 2, 4, 8, 6]


@pytest.mark.parametrize(
    ("fields", "curve", "reason", "offered"),
    [
        ({"maxProbes": 3}, lambda users: 0.1 * users, NeverReached.BUDGET, [1, 2, 4]),
        ({"maxLoad": 4}, lambda users: 0.1 * users, NeverReached.MAX_LOAD, [1, 2, 4]),
        ({"start": 7}, lambda users: 0.1 * users, NeverReached.START_ABOVE, [7]),
        (
            {"target": 0.55, "tolerance": 0.01},
            lambda users: 0.1 * users,
            NeverReached.BETWEEN_LOADS,
            [1, 2, 4, 8, 6, 5],
        ),
        ({}, lambda users: None, NeverReached.NO_READING, [1]),
    ],
)
def test_every_other_way_to_miss_the_target_is_named(
    fields: dict[str, Any], curve: Callable[[float], float | None], reason: NeverReached, offered: list[float]
) -> None:
    probe, seen = server(curve)
    summary, landed = search_utilisation(probe, aim(**fields), "cpu", True, ALWAYS)
    assert (summary.reached, summary.reason, seen, landed) == (False, reason, offered, None)
    assert summary.probes == len(offered) <= aim(**fields).max_probes


def test_the_search_starts_no_probe_after_max_seconds() -> None:
    ticks: Iterator[float] = iter(range(0, 1000, 10))
    probe, offered = server(lambda users: 0.01 * users)
    summary, _ = search_utilisation(probe, aim(maxSeconds=25), "cpu", True, ALWAYS, clock=lambda: next(ticks))
    assert (summary.reason, offered) == (NeverReached.BUDGET, [1, 2]), "started at 0; probes at 10 and 20; 30 > 25"


def test_with_probe_seconds_the_load_found_is_measured_again_for_the_full_duration() -> None:
    runs: list[tuple[float, int, float]] = []

    def run_one(users: float, index: int, seconds: float) -> LevelStats:
        runs.append((users, index, seconds))
        return stats(users, True)

    reading = Reading("cpu", lambda index: 0.1 * runs[index][0], ALWAYS)
    levels, summary = hold_utilisation(aim(probeSeconds=2), True, 30.0, run_one, reading)
    assert runs == [(1, 0, 2), (2, 1, 2), (4, 2, 2), (8, 3, 2), (6, 4, 2), (6, 5, 30.0)]
    assert len(levels) == 6 and summary.probes == 5 and summary.level_index == 5 and summary.reached


def experiment(load: dict[str, Any]) -> dict[str, Any]:
    return manifests.experiment("aim", load=load)


@pytest.mark.parametrize(
    ("load", "named"),
    [
        ({"mode": "open", "utilisationTarget": {"target": 0.5}}, "utilisationTarget.start"),
        ({"utilisationTarget": {"target": 0.5}, "concurrency": [1, 2]}, "remove concurrency"),
        ({"mode": "open", "rates": [5], "utilisationTarget": {"target": 0.5, "start": 1}}, "remove rates"),
        ({"utilisationTarget": {"target": 0.1, "tolerance": 0.2}}, "utilisationTarget.tolerance"),
        ({"utilisationTarget": {"target": 0.5, "start": 2.5}}, "utilisationTarget.start: 2.5 users"),
        ({"utilisationTarget": {"target": 0.5, "start": 8, "maxLoad": 4}}, "utilisationTarget.maxLoad 4"),
        ({"utilisationTarget": {"target": 1.5}}, "load.utilisationTarget.target"),
        ({"utilisationTarget": {"target": 0.5, "maxProbes": 99}}, "load.utilisationTarget.maxProbes"),
        ({"utilisationTarget": {"target": 0.5, "probeSeconds": 90}, "durationSeconds": 60}, "probeSeconds: 90"),
        ({"utilisationTarget": {"target": 0.5}, "repeats": 2}, "repeats: 2"),
    ],
)
def test_a_bad_utilisation_target_is_refused_naming_the_field(load: dict[str, Any], named: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_experiment(experiment(load))
    assert named in str(refused.value)


def test_a_spec_kept_with_its_defaults_filled_in_reads_back_the_same() -> None:
    """The operator's snapshot and the load Job's copy hold the validated spec, defaults in: the default
    levels there are not a choice the utilisation search refuses."""
    spec = parse_experiment(experiment({"utilisationTarget": {"target": 0.5}})).spec
    kept = snapshot.document("aim", spec)
    assert kept["spec"]["load"]["concurrency"] == [1, 4, 16]
    assert parse_experiment(kept).spec == spec
    assert cluster_problems(spec) == []


def test_the_table_tells_the_answer_and_the_probes() -> None:
    probe, _ = server(lambda users: min(0.1 * users, 0.35))
    summary, _ = search_utilisation(probe, aim(), "cpu", True, ALWAYS)
    document = ExperimentResults.model_validate(
        {"experiment": "aim", "model": "tiny", "utilisation": summary.model_dump(by_alias=True, mode="json")}
    )
    said = notes(document)
    assert "CPU utilisation 0.6 ± 0.05 never reached: server-limit (the load rose from c=4 to c=8" in said[-2]
    assert said[-1].startswith("utilisation probes (4): c=1: 0.1, 10.0 rps, p99 10.0 ms; c=2: 0.2")
