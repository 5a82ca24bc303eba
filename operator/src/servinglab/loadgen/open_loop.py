"""Open-loop load: requests leave at scheduled times, whether or not earlier ones have returned.

A closed loop (N users, each waiting for its answer) slows down with the server it measures, so an
overloaded server is sent less work and its latency looks better than a real client population
would see ("coordinated omission"). Here each level has a request rate; send times are fixed in
advance — evenly spaced (`constant`) or a Poisson process (`poisson`, exponential gaps from a
seeded generator) — and each request's latency is measured **from its scheduled send time**, so any
delay in sending counts against the result instead of vanishing.

What the generator could not do is counted, never hidden: a send that left later than the limit
after its scheduled time is `late` (its lag still counts in its latency); a send skipped because
`maxInFlight` requests were already outstanding is `dropped` (an error of kind `dropped`). The
generator's CPU and its send lag decide whether it, not the server, limited the level.

Runs under gevent (imported after Locust's monkey-patching, see :mod:`servinglab.entry`) with
geventhttpclient's connection pool. Used by the local runner and `servinglab loadtest`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import gevent
import gevent.pool
from geventhttpclient import HTTPClient

from servinglab.api import GeneratorLimits, RequestProtocol, ResponseCheck, StabilitySpec
from servinglab.api.figures import OpenLoopFigures
from servinglab.loadgen import shapes
from servinglab.loadgen.closed_loop import exchange
from servinglab.loadgen.cpumeter import CpuMeter
from servinglab.loadgen.hooks import LevelHooks, LevelTiming
from servinglab.loadgen.payloads import Payload
from servinglab.loadgen.precise_sleep import PreciseSleeper
from servinglab.loadgen.protocol import Request, encode_all
from servinglab.loadgen.stats import (
    LevelStats,
    Sample,
    generator_verdict,
    judge_stability,
    summarise,
)

_START_DELAY_SECONDS = 0.2  # lets the schedule start on time after setting up the level


@dataclass
class OpenLoopPlan:
    """What every open-loop level shares."""

    target: str
    path: str
    payloads: Sequence[Payload]
    request_timeout_seconds: float
    check: ResponseCheck | None = None
    arrival: str = "poisson"
    max_in_flight: int = 1024
    seed: int = 0
    stability: StabilitySpec = field(default_factory=StabilitySpec)
    generator_limits: GeneratorLimits = field(default_factory=GeneratorLimits)
    protocol: RequestProtocol = field(default_factory=RequestProtocol)  # the server kind's request encoding
    timing: LevelTiming = field(default_factory=LevelTiming)
    payload_offset: int = 0  # where this generator starts in the payloads (several generators)
    requests: list[Request] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.requests = encode_all(self.protocol, self.payloads)  # once per body, not per request


@dataclass
class _Level:
    """Book-keeping of one running level (one greenlet per outstanding request)."""

    measure_from: float  # perf_counter time from which sends are measured
    epoch_offset: float  # time.time() - time.perf_counter() at the start
    measure_until: float = 0.0  # end of the measured period (moves when an unstable level is extended)
    samples: list[Sample] = field(default_factory=list)
    lags_ms: list[float] = field(default_factory=list)
    late: int = 0
    dropped: int = 0
    in_flight: int = 0


def run_rates(
    plan: OpenLoopPlan,
    rates: Sequence[float],
    warmup_seconds: float,
    duration_seconds: float,
    hooks: LevelHooks | None = None,
    first_index: int = 0,
) -> list[LevelStats]:
    """Run each rate in turn; level i's hooks get `first_index + i`."""
    longest = max(duration_seconds, plan.stability.max_duration_seconds or 0.0)

    def schedule(rate: float, index: int) -> shapes.Schedule:
        # planned for the longest period the level may be extended to; measured for duration_seconds
        planned = shapes.steady(rate, warmup_seconds, longest, plan.arrival, plan.seed + index)
        return dataclasses.replace(planned, measured_seconds=duration_seconds)

    return [
        run_schedule(plan, schedule(rate, first_index + i), hooks, first_index + i)[0] for i, rate in enumerate(rates)
    ]


def run_schedule(
    plan: OpenLoopPlan, schedule: shapes.Schedule, hooks: LevelHooks | None = None, index: int = 0
) -> tuple[LevelStats]:
    """One run of a schedule: a steady level, or a shaped run (step, burst, trace) with its phases."""
    client = HTTPClient.from_url(
        plan.target,
        concurrency=plan.max_in_flight,
        connection_timeout=plan.request_timeout_seconds,
        network_timeout=plan.request_timeout_seconds,
    )
    try:
        return (_run_schedule(client, plan, index, schedule, hooks or LevelHooks()),)
    finally:
        client.close()


def _run_schedule(
    client: HTTPClient, plan: OpenLoopPlan, index: int, schedule: shapes.Schedule, hooks: LevelHooks
) -> LevelStats:
    rule = plan.stability
    warmup_seconds, duration_seconds = schedule.warmup_seconds, schedule.measured_seconds
    rate = schedule.phases[0].rate_rps if schedule.kind == "steady" else schedule.mean_rate_rps * schedule.senders
    epoch_offset = time.time() - time.perf_counter()
    planned_from = time.perf_counter() + _START_DELAY_SECONDS + warmup_seconds
    measure_from = plan.timing.measure_from(planned_from + epoch_offset) - epoch_offset
    start = measure_from - warmup_seconds
    level = _Level(measure_from=measure_from, epoch_offset=epoch_offset)
    level.measure_until = level.measure_from + duration_seconds
    pool = gevent.pool.Group()
    label = f"{rate:g} rps" if schedule.kind == "steady" else f"{schedule.kind} shape"

    def report(phase: str, done: float, planned: float) -> None:
        hooks.report(label, phase, done, planned, len(level.samples))

    cpu: CpuMeter | None = None
    with PreciseSleeper() as sleeper:
        for number, offset in enumerate(schedule.offsets):
            scheduled = start + offset
            if scheduled >= level.measure_until and not _measure_on(plan, level):
                break
            if cpu is None and scheduled >= level.measure_from:
                gevent.sleep(max(0.0, level.measure_from - time.perf_counter()))
                hooks.started(index)
                cpu = CpuMeter()
            sleeper.sleep_until(scheduled)
            if number % 64 == 0:
                elapsed = time.perf_counter() - start
                if elapsed < warmup_seconds:
                    report("warmup", elapsed, warmup_seconds)
                else:
                    report("measure", elapsed - warmup_seconds, duration_seconds)
            chosen = schedule.payload_indices[number] if schedule.payload_indices is not None else number
            request = plan.requests[(chosen + plan.payload_offset) % len(plan.requests)]
            _dispatch(client, plan, level, pool, scheduled, request)
        else:  # the schedule ended with the longest period allowed: its end is still judged (and told)
            _measure_on(plan, level)
    cpu_percent = cpu.percent() if cpu is not None else 0.0
    report("drain", 0.0, 0.0)
    pool.join(timeout=plan.request_timeout_seconds + 5.0)
    pool.kill(block=False)
    hooks.ended(index)
    measured_seconds = level.measure_until - level.measure_from
    # the whole measured period, every request answered
    start, end = level.epoch_offset + level.measure_from, level.epoch_offset + level.measure_until
    verdict = judge_stability(list(level.samples), start, end, rule)
    verdict = verdict.model_copy(update={"measured_seconds": round(measured_seconds, 3)})
    sent = len(level.samples) - level.dropped
    open_loop = OpenLoopFigures(
        offered_rps=rate,
        arrival=plan.arrival,
        sent_rps=round(sent / measured_seconds, 3) if measured_seconds > 0 else 0.0,
        late_sends=level.late,
        dropped_sends=level.dropped,
    )
    stats = summarise(None, level.samples)
    generator = generator_verdict(cpu_percent, level.lags_ms, plan.generator_limits, stats.latency_ms.p99)
    phases = shapes.phase_figures(level.samples, start, schedule) if schedule.kind != "steady" else None
    return dataclasses.replace(
        stats, rate_rps=rate, stability=verdict, generator=generator, open_loop=open_loop, phases=phases
    )


def _measure_on(plan: OpenLoopPlan, level: _Level) -> bool:
    """At the end of the measured period (waited for: the whole period is judged), whether to measure
    on, as the level's timing says."""
    gevent.sleep(max(0.0, level.measure_until - time.perf_counter()))
    start = level.epoch_offset + level.measure_from
    extra = plan.timing.extend(list(level.samples), start, level.measure_until - level.measure_from, plan.stability)
    level.measure_until += extra
    return extra > 0


def _dispatch(
    client: HTTPClient, plan: OpenLoopPlan, level: _Level, pool: gevent.pool.Group, scheduled: float, request: Request
) -> None:
    """Send now (one greenlet per request), or count the send as dropped or late."""
    measured = scheduled >= level.measure_from
    if level.in_flight >= plan.max_in_flight:
        if measured:
            level.dropped += 1
            level.samples.append(Sample(level.epoch_offset + scheduled, 0.0, "dropped"))
        return
    if measured and (time.perf_counter() - scheduled) * 1000.0 > plan.generator_limits.max_send_gap_ms:
        level.late += 1
    level.in_flight += 1  # counted before the greenlet runs, so the limit holds within one tick
    pool.spawn(_send, client, plan, level, scheduled, measured, request)


def _send(
    client: HTTPClient, plan: OpenLoopPlan, level: _Level, scheduled: float, measured: bool, request: Request
) -> None:
    sent = time.perf_counter()
    try:
        _, error = exchange(client, plan.path, request, plan.check, plan.protocol)
    finally:
        level.in_flight -= 1
    finished = time.perf_counter()
    if measured:
        level.lags_ms.append((sent - scheduled) * 1000.0)
        latency_ms = (finished - scheduled) * 1000.0  # from the scheduled time: no coordinated omission
        level.samples.append(Sample(level.epoch_offset + scheduled, latency_ms, error))
