"""Run the load section of an experiment: closed-loop levels, or open-loop rates and the peak search.

The one place that turns `spec.load` into level runs, shared by the local runner and `servinglab
loadtest` (the Kubernetes Job), so both produce the same levels. Level hooks receive the level's
index in the run (sweep levels first, then the peak-search probes). With `repeats`, each level runs
that many times and the runs are combined (:func:`stats.combine_repeats`); the server-side
breakdown is then that of the last run. With `generators` > 1 each level is split between that
many processes and merged exactly (:mod:`servinglab.loadgen.generators`). :func:`wait_until_serving`
is the check the Job makes before it measures.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from servinglab.api import LoadSpec, RequestProtocol, ResponseCheck
from servinglab.api.results import PeakRate
from servinglab.api.utilisation import UtilisationSearch
from servinglab.loadgen import closed_loop, generators, open_loop, shapes, sharing, wire
from servinglab.loadgen.hooks import LevelHooks
from servinglab.loadgen.payloads import Payload
from servinglab.loadgen.peak import search_peak_rate
from servinglab.loadgen.protocol import encode
from servinglab.loadgen.stats import LevelStats, combine_repeats
from servinglab.loadgen.utilisation import Reading, hold_utilisation


@dataclass(frozen=True)
class Target:
    """Where requests go and what they carry."""

    url: str
    path: str
    payloads: Sequence[Payload]
    check: ResponseCheck | None = None
    files_dir: Path | None = None  # where the payload files (and a trace) are; None: the working directory
    protocol: RequestProtocol = field(default_factory=RequestProtocol)  # how the server kind takes a body


#: The generator settings of a closed- or open-loop run.
Plan = closed_loop.LoadPlan | open_loop.OpenLoopPlan


@dataclass
class LoadOutcome:
    levels: list[LevelStats] = field(default_factory=list)
    sweep_levels: int = 0  # levels[:sweep_levels] are the requested levels, the rest peak-search probes
    peak: PeakRate | None = None
    utilisation: UtilisationSearch | None = None


def run_load(
    load: LoadSpec,
    probe_passes: Callable[[LevelStats], bool] | None,
    target: Target,
    hooks: LevelHooks | None = None,
    remote: Sequence[wire.Channel] = (),
    reading: Reading | None = None,
) -> LoadOutcome:
    """Every level of `load`, in this process or split between generators: `load.generators` local
    processes, or one local process and the `remote` generators (the other load pods) that joined.
    `probe_passes` judges the peak-rate search's probes against the SLO (no search without it);
    `reading` reads the server's utilisation for `load.utilisationTarget` (no search without it)."""
    plan: Plan
    if load.mode == "closed":
        plan = closed_loop.LoadPlan(
            target=target.url, path=target.path, payloads=target.payloads, check=target.check,
            request_timeout_seconds=load.request_timeout_seconds, stability=load.stability,
            generator_limits=load.generator, protocol=target.protocol,
        )  # fmt: skip
    else:
        plan = open_loop.OpenLoopPlan(
            target=target.url, path=target.path, payloads=target.payloads, check=target.check,
            request_timeout_seconds=load.request_timeout_seconds, arrival=load.arrival,
            max_in_flight=load.max_in_flight, seed=load.payload.seed, stability=load.stability,
            generator_limits=load.generator, protocol=target.protocol,
        )  # fmt: skip
    local = 1 if remote else sharing.resolve_count(load.generators)
    if load.shape is not None:
        return _run_shape(load, target, plan, hooks, local, remote)
    if local == 1 and not remote:
        return _run_levels(load, probe_passes, partial(_in_process, plan, load, hooks), reading)
    with generators.GeneratorPool(plan, local=local, remote=remote) as pool:
        return _run_levels(
            load, probe_passes,
            lambda level, index, seconds: pool.run_level(level, index, load.warmup_seconds, seconds, hooks),
            reading,
        )  # fmt: skip


def _run_shape(
    load: LoadSpec,
    target: Target,
    plan: Plan,
    hooks: LevelHooks | None,
    local: int,
    remote: Sequence[wire.Channel],
) -> LoadOutcome:
    """A shaped run (an open-loop step, burst or trace; a closed-loop step of users): one level over
    the whole schedule, never extended (its load varies by design), with each phase's figures."""
    assert load.shape is not None
    schedule = shapes.build(
        load.shape, load.warmup_seconds, load.arrival, load.payload.seed, target.files_dir, len(target.payloads),
        load.stability.window_seconds,
    )  # fmt: skip
    plan = dataclasses.replace(plan, stability=plan.stability.model_copy(update={"max_duration_seconds": None}))
    if local == 1 and not remote and isinstance(plan, closed_loop.LoadPlan):
        (stats,) = closed_loop.run_schedule(plan, schedule, hooks)
    elif local == 1 and not remote and isinstance(plan, open_loop.OpenLoopPlan):
        (stats,) = open_loop.run_schedule(plan, schedule, hooks)
    else:
        with generators.GeneratorPool(plan, local=local, remote=remote) as pool:
            stats = pool.run_schedule(schedule, 0, hooks)
    return LoadOutcome([stats], 1)


#: Runs one level: (users or rate, its index in the run, seconds measured) -> its statistics.
RunOne = Callable[[float, int, float], LevelStats]


def _in_process(
    plan: Plan, load: LoadSpec, hooks: LevelHooks | None, level: float, index: int, seconds: float
) -> LevelStats:
    if isinstance(plan, closed_loop.LoadPlan):
        run = closed_loop.run_levels(plan, [int(level)], load.warmup_seconds, seconds, hooks, index)
    else:
        run = open_loop.run_rates(plan, [level], load.warmup_seconds, seconds, hooks, index)
    return run[0]


def _run_levels(
    load: LoadSpec, probe_passes: Callable[[LevelStats], bool] | None, run_any: RunOne, reading: Reading | None
) -> LoadOutcome:
    """The requested levels (each repeated), then the open loop's peak-rate search if asked for; or the
    search for the load that holds a utilisation."""
    if load.utilisation_target is not None:
        if reading is None:  # a caller without a reading (the load Job is given one from Prometheus)
            raise ValueError("load.utilisationTarget: this load runs without a reading of the server's utilisation")
        levels, found = hold_utilisation(load.utilisation_target, load.mode == "closed", load.duration_seconds,
                                         run_any, reading)  # fmt: skip
        return LoadOutcome(levels, len(levels), utilisation=found)

    def run_one(level: float, index: int) -> LevelStats:
        return run_any(level, index, load.duration_seconds)

    if load.mode == "closed":
        stats = _each_repeated(run_one, [float(users) for users in load.concurrency], 0, load.repeats)
        return LoadOutcome(stats, len(stats))

    outcome = LoadOutcome()
    outcome.levels = _each_repeated(run_one, load.rates, 0, load.repeats)
    outcome.sweep_levels = len(outcome.levels)
    if load.rate_search is not None and probe_passes is not None:

        def probe(rate: float) -> LevelStats:
            (stats,) = _each_repeated(run_one, [rate], len(outcome.levels), load.repeats)
            outcome.levels.append(stats)
            return stats

        outcome.peak, _ = search_peak_rate(probe, load.rate_search, probe_passes)
    return outcome


def _each_repeated(
    run_one: Callable[[float, int], LevelStats], levels: Sequence[float], first_index: int, repeats: int
) -> list[LevelStats]:
    """Each level run `repeats` times and the runs combined; level i's hooks get `first_index + i`."""
    return [
        combine_repeats([run_one(level, first_index + offset) for _ in range(repeats)])
        for offset, level in enumerate(levels)
    ]


def wait_until_serving(
    target: Target, request_timeout_seconds: float, deadline_seconds: float
) -> tuple[float | None, str | None]:
    """Send test requests until one succeeds: (when it was answered, None), or (None, why not).

    A server can pass its health check while its workers are still loading or warming up the model;
    measuring then would only count time-outs. The first answered request also dates the end of
    the server's cold start more honestly than its health check does.
    """
    deadline = time.monotonic() + deadline_seconds
    problem = "no attempt made"
    first = encode(target.protocol, target.payloads[0])
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            target.url + target.path, data=first.body, headers=first.headers, method="POST"
        )
        timeout = max(1.0, min(request_timeout_seconds, deadline - time.monotonic()))
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
                return time.time(), None
        except urllib.error.HTTPError as exc:
            problem = f"HTTP {exc.code}: {exc.read()[:300]!r}"
        except (urllib.error.URLError, OSError) as exc:
            problem = str(exc)
        time.sleep(1.0)
    return None, f"the server did not answer a test request within {deadline_seconds:g} s (last: {problem})"
