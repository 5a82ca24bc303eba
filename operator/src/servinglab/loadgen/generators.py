"""Several load generators driving one level together, merged as if one had measured it.

One generator process is one gevent loop on one core (docs/benchmarks.md §2 and §8 give its
capacity); a faster server needs more. A `GeneratorPool` runs `spec.load.generators` of them: local
processes (over pipes), or the other pods of an indexed load Job, which join the first pod over TCP
(an HMAC handshake keyed by the experiment; their clocks are aligned by a round trip). For each
level it gives every generator its share — of the users, of the offered rate (each a Poisson
process of rate/N with its own seed: their sum is a Poisson process at the full rate), or of a
shaped run's schedule (every N-th send; each step's users) — and one common time at which all of
them start measuring, so their measured periods line up.

The coordinator (the calling process) decides for all of them: at the end of the measured period
each generator sends the samples it has so far, the coordinator judges stability on their union
and tells every generator to measure one more window or to stop. The merged level is exactly what
one process would have computed over the union of every request: nearest-rank percentiles over all
samples, throughput from the first send to the last answer, errors by kind, stability windows, open-
loop sent/late/dropped counts summed. Each generator's saturation is judged again against the merged
p99 latency; any saturated generator flags the level, naming which (:func:`stats.merge_generator_verdicts`).

Used by :func:`servinglab.loadgen.levels.run_load` when more than one generator is asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import socket
import time
from collections.abc import Sequence
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

import gevent

from servinglab.loadgen import closed_loop, open_loop, shapes, sharing
from servinglab.loadgen.hooks import LevelHooks, LevelTiming
from servinglab.loadgen.stats import (
    LevelStats,
    Sample,
    extension_seconds,
)

#: Users a generator spawns per second (Locust's advice); the common start leaves time for it.
_SPAWN_RATE = 100
_SETUP_SECONDS = 1.0
#: Seeds of different generators' arrival streams are this far apart.
_SEED_STRIDE = 1_000_003
_TICK_SECONDS = 0.25


class _CoordinatedTiming(LevelTiming):
    """A generator's timing when a coordinator decides: its start time, and each extension."""

    def __init__(self, connection: Connection, measure_from: float) -> None:
        self._connection = connection
        self._measure_from = measure_from
        self.sent = 0  # samples already with the coordinator (a level's samples only ever grow)

    def measure_from(self, planned: float) -> float:
        return self._measure_from

    def extend(self, samples: Sequence[Sample], start: float, measured: float, rule: Any) -> float:
        self._connection.send(("samples", list(samples[self.sent :])))
        self.sent = len(samples)
        while not self._connection.poll():  # the generator's users keep sending meanwhile
            gevent.sleep(0.002)
        extra: float = self._connection.recv()
        return extra


def serve(connection: Connection) -> None:
    """A generator: takes its plan from the coordinator, then runs each level it is given with its
    share, until told to stop. The same over a pipe (a local process) or TCP (a load pod)."""
    loop: str = "closed"
    plan: Any = None  # the first order carries it
    while (order := connection.recv()) is not None:
        if order == "clock":  # the coordinator measures this generator's clock offset
            connection.send(time.time())
            continue
        if order[0] == "plan":
            _, loop, plan = order
            continue
        share, index, measure_from, warmup_seconds, duration_seconds = order
        plan.timing = timing = _CoordinatedTiming(connection, measure_from)
        if isinstance(share, shapes.Schedule) and loop == "closed":
            (stats,) = closed_loop.run_schedule(plan, share, index=index)
        elif isinstance(share, shapes.Schedule):
            (stats,) = open_loop.run_schedule(plan, share, index=index)
        elif loop == "closed":
            (stats,) = closed_loop.run_levels(plan, [share], warmup_seconds, duration_seconds, first_index=index)
        else:
            (stats,) = open_loop.run_rates(plan, [share], warmup_seconds, duration_seconds, first_index=index)
        # the coordinator has the samples it was sent while deciding: only the rest travel again
        connection.send(("done", dataclasses.replace(stats, samples=stats.samples[timing.sent :])))


def _blocking(connection: Connection) -> Connection:
    # a connection made under gevent's patched socket module is non-blocking; recv() expects blocking
    os.set_blocking(connection.fileno(), True)
    return connection


def _authenticated(sock: socket.socket, authkey: bytes, first: bool) -> Connection:
    """A blocking Connection over `sock`, once both ends have proved they hold `authkey` (the HMAC
    handshake multiprocessing's Listener and Client use; done here on a socket made blocking first)."""
    connection = _blocking(Connection(sock.detach()))
    if first:
        deliver_challenge(connection, authkey)
        answer_challenge(connection, authkey)
    else:
        answer_challenge(connection, authkey)
        deliver_challenge(connection, authkey)
    return connection


def accept_generators(address: tuple[str, int], count: int, authkey: bytes, timeout_seconds: float) -> list[Connection]:
    """Wait for `count` generators to join over TCP (the other pods of an indexed load Job)."""
    joined: list[Connection] = []
    with socket.create_server(address) as server:
        try:
            with gevent.Timeout(timeout_seconds):  # the load command runs gevent-patched: accept() yields
                while len(joined) < count:
                    sock, peer = server.accept()
                    try:
                        joined.append(_authenticated(sock, authkey, first=True))
                    except (AuthenticationError, EOFError, OSError) as exc:  # not one of ours: ignored
                        logging.getLogger(__name__).warning("refused a generator connection from %s: %s", peer, exc)
        except gevent.Timeout:
            raise GeneratorError(
                f"{len(joined)} of {count} load generators joined within {timeout_seconds:g} s"
            ) from None
    return joined


def join_coordinator(address: tuple[str, int], authkey: bytes, timeout_seconds: float) -> Connection:
    """Connect to the coordinator (pod 0 of an indexed load Job), retrying while it starts."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            return _authenticated(socket.create_connection(address, timeout=10), authkey, first=False)
        except AuthenticationError as exc:
            raise GeneratorError(
                f"the load coordinator at {address[0]}:{address[1]} refused this generator: {exc}"
            ) from None
        except OSError as exc:
            if time.monotonic() > deadline:
                raise GeneratorError(f"cannot reach the load coordinator at {address[0]}:{address[1]}: {exc}") from None
            time.sleep(1.0)


class GeneratorError(RuntimeError):
    """Generators could not be brought together."""


class GeneratorPool:
    """Generators for a closed-loop (`LoadPlan`) or open-loop (`OpenLoopPlan`) run: `local` processes
    started here, and `remote` ones already connected (whose clocks may differ from this one's)."""

    def __init__(
        self, plan: closed_loop.LoadPlan | open_loop.OpenLoopPlan, local: int, remote: Sequence[Connection] = ()
    ) -> None:
        self.loop = "closed" if isinstance(plan, closed_loop.LoadPlan) else "open"
        self.plan = plan
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: gevent patches it itself
        self._connections: list[Connection] = []
        self._offsets: list[float] = []  # each generator's clock minus this one's
        self._processes: list[Any] = []
        for _ in range(local):
            parent, child = context.Pipe()
            process = context.Process(target=serve, args=(_blocking(child),), daemon=True)
            process.start()
            child.close()
            self._connections.append(_blocking(parent))
            self._offsets.append(0.0)  # the same clock
            self._processes.append(process)
        for connection in remote:
            self._connections.append(connection)
            self._offsets.append(_clock_offset(connection))
        count = len(self._connections)
        payloads = max(1, len(plan.payloads))
        for number, connection in enumerate(self._connections):
            offset = number * payloads // count  # generators start at different bodies
            own: closed_loop.LoadPlan | open_loop.OpenLoopPlan
            if isinstance(plan, open_loop.OpenLoopPlan):
                own = dataclasses.replace(plan, payload_offset=offset, seed=plan.seed + number * _SEED_STRIDE)
            else:
                own = dataclasses.replace(plan, payload_offset=offset)
            connection.send(("plan", self.loop, own))

    @property
    def count(self) -> int:
        return len(self._connections)

    def run_level(
        self, level: float, index: int, warmup_seconds: float, duration_seconds: float, hooks: LevelHooks | None = None
    ) -> LevelStats:
        """One level (users or rate) split between the generators and merged exactly."""
        shares: list[Any]
        if self.loop == "closed":
            shares = shapes.split_users(int(level), self.count)
            setup = _SETUP_SECONDS + max(shares) / _SPAWN_RATE
        else:
            shares, setup = sharing.split_rate(level, self.count), _SETUP_SECONDS
        label = f"c={int(level)}" if self.loop == "closed" else f"{level:g} rps"
        return self._run(shares, setup, index, warmup_seconds, duration_seconds, hooks or LevelHooks(), label, level)

    def run_schedule(self, schedule: shapes.Schedule, index: int, hooks: LevelHooks | None = None) -> LevelStats:
        """A shaped run: each generator sends every N-th request of the schedule (open loop), or holds
        its share of each step's users (closed loop)."""
        shares = [schedule.share(number, self.count) for number in range(self.count)]
        first_users = schedule.phases[0].users
        level = float(first_users) if first_users is not None else schedule.mean_rate_rps
        setup = _SETUP_SECONDS + (first_users or 0) / self.count / _SPAWN_RATE
        hooks = hooks or LevelHooks()
        return self._run(shares, setup, index, schedule.warmup_seconds, schedule.measured_seconds, hooks,
                         f"{schedule.kind} shape", level, schedule)  # fmt: skip

    def _run(
        self, shares: list[Any], setup: float, index: int, warmup_seconds: float, duration_seconds: float,
        hooks: LevelHooks, label: str, level: float, schedule: shapes.Schedule | None = None,
    ) -> LevelStats:  # fmt: skip
        """Give each generator its share (users, a rate or a schedule), start them together, decide
        extensions on their merged samples, and merge their results."""
        active = [i for i, share in enumerate(shares) if not isinstance(share, int | float) or share > 0]
        measure_from = time.time() + setup + warmup_seconds
        for i in active:
            order = (shares[i], index, measure_from + self._offsets[i], warmup_seconds, duration_seconds)
            self._connections[i].send(order)
        self._tick_until(measure_from, hooks, label, "warmup", warmup_seconds)
        hooks.started(index)
        self._tick_until(measure_from + duration_seconds, hooks, label, "measure", duration_seconds)
        streamed: dict[int, list[Sample]] = {i: [] for i in active}  # each generator's samples so far
        samples: list[Sample] = []
        measured = duration_seconds
        while True:
            for i in active:
                more = self._own_clock(i, self._receive(i, "samples"))
                streamed[i].extend(more)
                samples.extend(more)
            extra = extension_seconds(samples, measure_from, measured, self.plan.stability, time.time())
            for i in active:
                self._connections[i].send(extra)
            if extra <= 0:
                break
            measured += extra
            hooks.report(label, "extend", measured, self.plan.stability.max_duration_seconds or measured, len(samples))
        parts = []
        for i in active:
            stats: LevelStats = self._receive(i, "done")  # its figures, and the samples not streamed yet
            rest = self._own_clock(i, stats.samples)
            parts.append(dataclasses.replace(stats, samples=tuple(streamed[i] + rest)))
        hooks.ended(index)
        return sharing.merge_levels(
            parts, measure_from, measured, level, closed=self.loop == "closed", stability=self.plan.stability,
            limits=self.plan.generator_limits, schedule=schedule,
        )  # fmt: skip

    def _receive(self, number: int, expected: str) -> Any:
        try:
            kind, payload = self._connections[number].recv()
        except (EOFError, OSError) as exc:
            raise GeneratorError(f"load generator {number + 1} of {self.count} stopped answering: {exc!r}") from None
        if kind != expected:
            raise GeneratorError(f"load generator {number + 1} of {self.count} sent {kind!r}, not {expected!r}")
        return payload

    def _own_clock(self, number: int, samples: Sequence[Sample]) -> list[Sample]:
        """A generator's samples with their send times on this process's clock."""
        offset = self._offsets[number]
        if offset == 0.0:
            return list(samples)
        return [dataclasses.replace(sample, sent_at=sample.sent_at - offset) for sample in samples]

    def _tick_until(self, until: float, hooks: LevelHooks, label: str, phase: str, planned: float) -> None:
        while (left := until - time.time()) > 0:
            hooks.report(label, phase, max(0.0, planned - left), planned, 0)
            time.sleep(min(_TICK_SECONDS, left))

    def close(self) -> None:
        for connection in self._connections:
            with contextlib.suppress(OSError):  # a generator that died has closed its end
                connection.send(None)
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()

    def __enter__(self) -> GeneratorPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _clock_offset(connection: Connection, rounds: int = 5) -> float:
    """The other end's clock minus this one's, from the round trip with the least delay."""
    best: tuple[float, float] | None = None
    for _ in range(rounds):
        sent = time.time()
        connection.send("clock")
        theirs = float(connection.recv())
        answered = time.time()
        if best is None or answered - sent < best[0]:
            best = (answered - sent, theirs - (sent + answered) / 2)
    assert best is not None
    return best[1]
