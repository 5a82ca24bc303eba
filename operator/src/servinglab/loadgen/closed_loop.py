"""Closed-loop load levels with Locust: N users, each sending its next request when the last returns.

Locust supplies the users and the runner; each user posts on its own geventhttpclient connection
(the client under Locust's FastHttpUser, without Locust's per-request events and response wrapper)
and servinglab records every request itself (send time and latency from `time.perf_counter`, full
float precision), because Locust's own statistics round latencies into buckets.

One level = spawn N users -> warm-up (excluded) -> measurement period (extended window by window
while the level is unstable, up to the stability limit) -> stop sending, wait for every measured
request to finish -> stop users. Each level reports whether its last windows agreed (stability) and
whether the generator itself limited the load: its CPU over the period, and the send gap — how long
a user that had its response waited before sending again (zero think time, so any gap is the
generator's own delay). Hooks let the caller read server metrics exactly at the start and end of
each measured window. Used in-process by the local runner and by `servinglab
loadtest` (the Kubernetes Job's command).
"""

from __future__ import annotations

from locust import User, constant, task
from locust.env import Environment

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import gevent
from geventhttpclient import HTTPClient

from servinglab.api import GeneratorLimits, RequestProtocol, ResponseCheck, StabilitySpec
from servinglab.loadgen import shapes
from servinglab.loadgen.cpumeter import CpuMeter
from servinglab.loadgen.hooks import LevelHooks, LevelTiming
from servinglab.loadgen.payloads import Payload
from servinglab.loadgen.protocol import Request, answer_problem, encode_all
from servinglab.loadgen.stats import (
    LevelStats,
    Sample,
    generator_verdict,
    judge_stability,
    summarise,
)

_TICK_SECONDS = 0.25
_MAX_SPAWN_RATE = 100


@dataclass
class LoadPlan:
    """Everything a level run needs; shared with the users through the Locust environment."""

    target: str
    path: str
    payloads: Sequence[Payload]
    request_timeout_seconds: float
    check: ResponseCheck | None = None
    stability: StabilitySpec = field(default_factory=StabilitySpec)
    generator_limits: GeneratorLimits = field(default_factory=GeneratorLimits)
    protocol: RequestProtocol = field(default_factory=RequestProtocol)  # the server kind's request encoding
    timing: LevelTiming = field(default_factory=LevelTiming)
    payload_offset: int = 0  # where this generator's users start in the payloads (several generators)
    locust_stats: bool = False  # also feed Locust's own statistics (its UI), at Locust's cost per request
    sending: bool = False
    measuring_since: float | None = None
    in_flight: int = 0
    samples: list[Sample] = field(default_factory=list)
    send_gaps_ms: list[float] = field(default_factory=list)
    requests: list[Request] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.requests = encode_all(self.protocol, self.payloads)  # once per body, not per request

    def record(self, sent_at: float, latency_ms: float, error: str | None) -> None:
        if self.measuring_since is not None and sent_at >= self.measuring_since:
            self.samples.append(Sample(sent_at, latency_ms, error))

    def record_gap(self, gap_ms: float) -> None:
        if self.measuring_since is not None:
            self.send_gaps_ms.append(gap_ms)


def error_kind(status: int, exception: BaseException | None) -> str | None:
    """`None` for a 2xx answer, else `http_<status>`, `timeout` or `connection:<cause>`."""
    if exception is not None and status == 0:
        # the HTTP client wraps the real cause (e.g. a time-out) in RetriesExceeded; report the cause
        chain: list[BaseException] = []
        current: BaseException | None = exception
        while current is not None and len(chain) < 5:
            chain.append(current)
            original = getattr(current, "original", None)
            current = original if isinstance(original, BaseException) else (current.__cause__ or current.__context__)
        if any("timeout" in type(e).__name__.lower() or "timed out" in str(e).lower() for e in chain):
            return "timeout"
        return f"connection:{type(chain[-1]).__name__}"
    if 200 <= status < 300:
        return None
    return f"http_{status}"


def exchange(
    client: HTTPClient, path: str, request: Request, check: ResponseCheck | None, protocol: RequestProtocol
) -> tuple[int, str | None]:
    """POST one (encoded) request and read the whole answer: (status, error kind or None). The one exchange
    both loops make, on geventhttpclient directly (no per-request bookkeeping but servinglab's)."""
    try:
        response = client.post(path, body=request.body, headers=request.headers)
        try:
            answer = response.read()
        finally:
            response.release()
    except (OSError, gevent.Timeout) as exc:
        return 0, error_kind(0, exc)
    return response.status_code, error_kind(response.status_code, None) or answer_problem(
        protocol, response.status_code, answer, check
    )


class InferenceUser(User):
    """POSTs one request body after another to TorchServe's prediction endpoint, back to back, on its
    own keep-alive connection. Every request is recorded by servinglab (exact latencies); Locust's
    own statistics are fed only when the plan asks (`locust_stats`, for Locust's UI)."""

    wait_time = constant(0)
    host = "http://127.0.0.1:8080"  # replaced per environment
    _offset = 0

    def on_start(self) -> None:
        # Users start at different payloads so a batch mixes images.
        InferenceUser._offset += 1
        plan = self._plan
        self.next_payload = InferenceUser._offset + plan.payload_offset
        self.free_since: float | None = None  # when this user's last response arrived
        timeout = plan.request_timeout_seconds
        self.http = HTTPClient.from_url(plan.target, concurrency=1, connection_timeout=timeout, network_timeout=timeout)

    def on_stop(self) -> None:
        self.http.close()

    @property
    def _plan(self) -> LoadPlan:
        plan: LoadPlan = self.environment.servinglab_plan
        return plan

    @task
    def predict(self) -> None:
        plan = self._plan
        if not plan.sending:
            gevent.sleep(0.01)
            self.free_since = None
            return
        request = plan.requests[self.next_payload % len(plan.requests)]
        self.next_payload += 1
        plan.in_flight += 1
        sent_at = time.time()
        started = time.perf_counter()
        if self.free_since is not None:
            plan.record_gap((started - self.free_since) * 1000.0)
        try:
            _status, error = exchange(self.http, plan.path, request, plan.check, plan.protocol)
        finally:
            self.free_since = time.perf_counter()
            plan.in_flight -= 1
        latency_ms = (self.free_since - started) * 1000.0
        plan.record(sent_at, latency_ms, error)
        if plan.locust_stats:
            self.environment.events.request.fire(
                request_type="POST", name="predictions", response_time=latency_ms, response_length=0,
                exception=RuntimeError(error) if error else None, context={}, url=plan.path,
            )  # fmt: skip


def run_levels(
    plan: LoadPlan,
    levels: Sequence[int],
    warmup_seconds: float,
    duration_seconds: float,
    hooks: LevelHooks | None = None,
    first_index: int = 0,
) -> list[LevelStats]:
    """Run each concurrency level in turn and return its exact statistics; level i's hooks get
    `first_index + i`."""
    hooks = hooks or LevelHooks()
    with _locust_runner(plan) as runner:
        return [
            _run_level(runner, plan, first_index + i, level, warmup_seconds, duration_seconds, hooks)
            for i, level in enumerate(levels)
        ]


def run_schedule(
    plan: LoadPlan, schedule: shapes.Schedule, hooks: LevelHooks | None = None, index: int = 0
) -> tuple[LevelStats]:
    """A closed-loop step: the first step's users warm up, then each step's users hold for its
    stretch; one level with each step's figures."""
    first = schedule.phases[0].users or 0
    with _locust_runner(plan) as runner:
        return (_run_level(runner, plan, index, first, schedule.warmup_seconds, schedule.measured_seconds,
                           hooks or LevelHooks(), schedule),)  # fmt: skip


@contextlib.contextmanager
def _locust_runner(plan: LoadPlan) -> Iterator[Any]:
    """A local Locust runner whose users read `plan`; quit on the way out."""
    environment = Environment(user_classes=[InferenceUser], host=plan.target)
    environment.servinglab_plan = plan  # type: ignore[attr-defined]
    runner = environment.create_local_runner()
    try:
        yield runner
    finally:
        runner.quit()


def _set_users(runner: Any, users: int) -> None:
    """Locust spawns (or stops) users at up to 100 a second to reach `users`."""
    if users == 0:
        runner.stop()
    else:
        runner.start(users, spawn_rate=min(users, _MAX_SPAWN_RATE), wait=False)


def _run_level(
    runner: Any,
    plan: LoadPlan,
    index: int,
    level: int,
    warmup_seconds: float,
    duration_seconds: float,
    hooks: LevelHooks,
    steps: shapes.Schedule | None = None,
) -> LevelStats:
    def report(phase: str, done: float, planned: float) -> None:
        hooks.report(f"c={level}" if steps is None else "step shape", phase, done, planned, len(plan.samples))

    plan.samples = []
    plan.measuring_since = None
    plan.sending = True
    # Locust warns above 100 users/s; spawning finishes before the warm-up clock starts, so a
    # level's warm-up and measurement always run at full concurrency.
    _set_users(runner, level)
    while runner.user_count < level:
        gevent.sleep(0.02)
    measure_from = plan.timing.measure_from(time.time() + warmup_seconds)
    _wait(max(0.0, measure_from - time.time()), lambda done: report("warmup", done, warmup_seconds))

    hooks.started(index)
    plan.send_gaps_ms = []
    since = plan.measuring_since = max(measure_from, time.time())
    cpu = CpuMeter()
    for phase in steps.phases[1:] if steps is not None else ():  # each step's users from its start on
        _wait(max(0.0, since + phase.start - time.time()), lambda _: report("measure", time.time() - since,
              duration_seconds))  # fmt: skip
        _set_users(runner, phase.users or 0)
    _wait(max(0.0, since + duration_seconds - time.time()), lambda _: report("measure", time.time() - since,
          duration_seconds))  # fmt: skip
    rule = plan.stability
    measured = duration_seconds
    while (extra := plan.timing.extend(list(plan.samples), since, measured, rule)) > 0:
        _wait(extra, functools.partial(_report_extension, report, measured, rule.max_duration_seconds or measured))
        measured += extra
    plan.sending = False
    cpu_percent = cpu.percent()

    # Every request sent inside the period counts, so wait for the stragglers (bounded by the
    # request timeout, after which the client itself gives up and records a timeout).
    deadline = time.monotonic() + plan.request_timeout_seconds + 5.0
    while plan.in_flight > 0 and time.monotonic() < deadline:
        report("drain", 0.0, 0.0)
        gevent.sleep(0.02)
    hooks.ended(index)
    runner.stop()
    samples, plan.samples, plan.measuring_since = plan.samples, [], None
    # the final verdict: the whole measured period, every request answered
    verdict = judge_stability(samples, since, since + measured, plan.stability)
    verdict = verdict.model_copy(update={"measured_seconds": round(measured, 3)})
    stats = summarise(level, samples)
    generator = generator_verdict(cpu_percent, plan.send_gaps_ms, plan.generator_limits, stats.latency_ms.p99)
    phases = shapes.phase_figures(samples, since, steps) if steps is not None else None
    return dataclasses.replace(stats, stability=verdict, generator=generator, phases=phases)


def _report_extension(report: Callable[[str, float, float], None], base: float, limit: float, done: float) -> None:
    report("extend", base + done, limit)


def _wait(seconds: float, tick: Callable[[float], None]) -> None:
    started = time.monotonic()
    while (done := time.monotonic() - started) < seconds:
        tick(done)
        gevent.sleep(min(_TICK_SECONDS, seconds - done))
    tick(seconds)
