"""Several load generators driving one level together, merged as if one had measured it.

One generator process is one gevent loop on one core (docs/benchmarks.md §2 and §8 give its
capacity); a faster server needs more. A `GeneratorPool` runs `spec.load.generators` of them: local
processes (each on a socket pair), or the other pods of an indexed load Job, which join the first pod
over TCP (:mod:`meeting`; their clocks are aligned by a round trip). Both speak one protocol
(:mod:`wire`: a mutual HMAC handshake on a random key, then MAC'd JSON frames of :mod:`messages`;
nothing is unpickled). For each level the pool gives every
generator its share — of the users, of the offered rate (each a Poisson
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
Every answer the coordinator waits for is due by a deadline it knows (the level's set-up, warm-up and
measured time, the drain's request timeout, plus REPLY_MARGIN_SECONDS): a generator that does not answer
by then — its pod or node gone without closing the connection — ends the level with GeneratorError
naming it, instead of holding the first pod until the Job's own deadline.

Used by :func:`servinglab.loadgen.levels.run_load` when more than one generator is asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import socket
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from servinglab.api import StabilitySpec
from servinglab.loadgen import closed_loop, messages, open_loop, shapes, sharing, wire
from servinglab.loadgen.hooks import LevelHooks, LevelTiming
from servinglab.loadgen.stats import (
    LevelStats,
    Sample,
    extension_seconds,
)

_T = TypeVar("_T")
#: Users a generator spawns per second (Locust's advice); the common start leaves time for it.
_SPAWN_RATE = 100
_SETUP_SECONDS = 1.0
#: Seeds of different generators' arrival streams are this far apart.
_SEED_STRIDE = 1_000_003
_TICK_SECONDS = 0.25
#: A local generator process has this long to start (a fresh interpreter importing Locust) and answer.
_LOCAL_START_SECONDS = 120.0
#: How long past its due time the coordinator waits for a generator's answer before giving it up.
REPLY_MARGIN_SECONDS = 30.0


class _CoordinatedTiming(LevelTiming):
    """A generator's timing when a coordinator decides: its start time, and each extension."""

    def __init__(self, channel: wire.Channel, measure_from: float) -> None:
        self._channel = channel
        self._measure_from = measure_from
        self.sent = 0  # samples already with the coordinator (a level's samples only ever grow)

    def measure_from(self, planned: float) -> float:
        return self._measure_from

    def extend(self, samples: Sequence[Sample], start: float, measured: float, rule: StabilitySpec) -> float:
        messages.send_samples(self._channel, samples[self.sent :])
        self.sent = len(samples)
        # gevent's sockets wait cooperatively: the generator's users keep sending meanwhile
        return messages.read_extend(self._channel.recv())


def serve(channel: wire.Channel) -> None:
    """A generator: takes its plan from the coordinator, then runs each level it is given with its
    share, until told to stop. The same over a socket pair (a local process) or TCP (a load pod)."""
    plan: closed_loop.LoadPlan | open_loop.OpenLoopPlan | None = None  # the first order carries it
    while (order := channel.recv())["kind"] != "stop":
        if order["kind"] == "clock":  # the coordinator measures this generator's clock offset
            channel.send(messages.clock(time.time()))
            continue
        if order["kind"] == "plan":
            _, plan = messages.read_plan(order, channel)
            continue
        share, index, measure_from, warmup_seconds, duration_seconds = messages.read_level(order)
        if plan is None:
            raise messages.MessageError("a 'level' message came before the plan")
        plan.timing = timing = _CoordinatedTiming(channel, measure_from)
        if isinstance(share, shapes.Schedule):
            if isinstance(plan, closed_loop.LoadPlan):
                (stats,) = closed_loop.run_schedule(plan, share, index=index)
            else:
                (stats,) = open_loop.run_schedule(plan, share, index=index)
        elif isinstance(plan, closed_loop.LoadPlan):
            (stats,) = closed_loop.run_levels(plan, [int(share)], warmup_seconds, duration_seconds, first_index=index)
        else:
            (stats,) = open_loop.run_rates(plan, [float(share)], warmup_seconds, duration_seconds, first_index=index)
        # the coordinator has the samples it was sent while deciding: only the rest travel again
        messages.send_done(channel, dataclasses.replace(stats, samples=stats.samples[timing.sent :]))


def serve_local(connection: Connection, key: bytes) -> None:
    """A local generator process: its end of the runner's socket pair (no pickled message ever
    crosses it: only the socket is taken from the Connection), authenticated with the runner's key."""
    sock = _socket_of(connection)
    serve(wire.join(sock, key, _LOCAL_START_SECONDS))


def _socket_of(connection: Connection) -> socket.socket:
    """The socket under a duplex Pipe end (a socket pair on POSIX); the Connection itself is closed. Made
    here, after Locust's import patched the socket module, so its waits are cooperative."""
    sock = socket.socket(fileno=os.dup(connection.fileno()))
    connection.close()
    return sock


class GeneratorError(RuntimeError):
    """Generators could not be brought together."""


class GeneratorPool:
    """Generators for a closed-loop (`LoadPlan`) or open-loop (`OpenLoopPlan`) run: `local` processes
    started here, and `remote` ones already connected (whose clocks may differ from this one's). Each
    answer is waited for until `reply_margin_seconds` past its due time."""

    def __init__(
        self, plan: closed_loop.LoadPlan | open_loop.OpenLoopPlan, local: int, remote: Sequence[wire.Channel] = (),
        reply_margin_seconds: float = REPLY_MARGIN_SECONDS,
    ) -> None:  # fmt: skip
        self.loop = "closed" if isinstance(plan, closed_loop.LoadPlan) else "open"
        self.plan = plan
        self.reply_margin_seconds = reply_margin_seconds
        self._channels: list[wire.Channel] = []
        self._offsets: list[float] = []  # each generator's clock minus this one's
        self._processes: list[Any] = []
        try:
            self._start_local(local)
            for channel in remote:
                self._channels.append(channel)
                try:
                    self._offsets.append(_clock_offset(channel, reply_margin_seconds))
                except (wire.WireError, OSError) as exc:
                    raise GeneratorError(f"{self._name(len(self._channels) - 1)} did not answer: {exc}") from None
            self._send_plans()
        except BaseException:
            self.close()
            raise

    def _send_plans(self) -> None:
        """Each generator's own copy of the plan: where it starts in the bodies, its arrival seed."""
        plan, count = self.plan, len(self._channels)
        payloads = max(1, len(plan.payloads))
        for number in range(count):
            offset = number * payloads // count  # generators start at different bodies
            own: closed_loop.LoadPlan | open_loop.OpenLoopPlan
            if isinstance(plan, open_loop.OpenLoopPlan):
                own = dataclasses.replace(plan, payload_offset=offset, seed=plan.seed + number * _SEED_STRIDE)
            else:
                own = dataclasses.replace(plan, payload_offset=offset)
            for message in messages.plan_messages(self.loop, own):
                self._send(number, message)

    def _start_local(self, count: int) -> None:
        """`count` generator processes, each on its end of a socket pair. They speak the same protocol as
        load pods do, under a key made for this pool alone (handed to them by multiprocessing's own
        spawn pipe): one protocol, and no other process on this machine could join even if it got hold
        of the socket."""
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: gevent patches it itself
        key = wire.new_key()
        ends = []
        for _ in range(count):
            parent, child = context.Pipe()  # a socket pair; only its sockets are used
            process = context.Process(target=serve_local, args=(child, key), daemon=True)
            process.start()
            child.close()
            self._processes.append(process)
            ends.append(_socket_of(parent))
        for number, sock in enumerate(ends):
            try:
                self._channels.append(wire.accept(sock, key, _LOCAL_START_SECONDS))
            except (wire.WireError, OSError) as exc:
                for other in ends[number:]:
                    other.close()
                raise GeneratorError(f"local load generator {number + 1} of {count} did not start: {exc}") from None
            self._offsets.append(0.0)  # the same clock

    @property
    def count(self) -> int:
        return len(self._channels)

    def run_level(
        self, level: float, index: int, warmup_seconds: float, duration_seconds: float, hooks: LevelHooks | None = None
    ) -> LevelStats:
        """One level (users or rate) split between the generators and merged exactly."""
        shares: Sequence[messages.Share]
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
        self, shares: Sequence[messages.Share], setup: float, index: int, warmup_seconds: float,
        duration_seconds: float, hooks: LevelHooks, label: str, level: float, schedule: shapes.Schedule | None = None,
    ) -> LevelStats:  # fmt: skip
        """Give each generator its share (users, a rate or a schedule), start them together, decide
        extensions on their merged samples, and merge their results."""
        active = [i for i, share in enumerate(shares) if not isinstance(share, int | float) or share > 0]
        measure_from = time.time() + setup + warmup_seconds
        for i in active:
            order = messages.level(shares[i], index, measure_from + self._offsets[i], warmup_seconds, duration_seconds)
            self._send(i, order)
        self._tick_until(measure_from, hooks, label, "warmup", warmup_seconds)
        hooks.started(index)
        self._tick_until(measure_from + duration_seconds, hooks, label, "measure", duration_seconds)
        streamed: dict[int, list[Sample]] = {i: [] for i in active}  # each generator's samples so far
        samples: list[Sample] = []
        measured = duration_seconds
        while True:
            # due at the end of the measured period: set-up, warm-up and measured time after the order
            due = time.monotonic() + measure_from + measured - time.time()
            why = f"its samples (due after {setup + warmup_seconds:g} s of set-up and warm-up, {measured:g} s measured)"
            for i in active:
                more = self._own_clock(i, self._receive(i, messages.receive_samples, due, why))
                streamed[i].extend(more)
                samples.extend(more)
            extra = extension_seconds(samples, measure_from, measured, self.plan.stability, time.time())
            for i in active:
                self._send(i, messages.extend(extra))
            if extra <= 0:
                break
            measured += extra
            hooks.report(label, "extend", measured, self.plan.stability.max_duration_seconds or measured, len(samples))
        parts = []
        # due once the requests still in flight have been answered or timed out
        timeout = self.plan.request_timeout_seconds
        due, why = time.monotonic() + timeout, f"its figures (due once its last requests ended, within {timeout:g} s)"
        for i in active:
            stats = self._receive(i, messages.receive_done, due, why)  # its figures, and the samples not streamed yet
            rest = self._own_clock(i, stats.samples)
            parts.append(dataclasses.replace(stats, samples=tuple(streamed[i] + rest)))
        hooks.ended(index)
        return sharing.merge_levels(
            parts, measure_from, measured, level, closed=self.loop == "closed", stability=self.plan.stability,
            limits=self.plan.generator_limits, schedule=schedule,
        )  # fmt: skip

    def _name(self, number: int) -> str:
        peer = self._channels[number].peer
        return f"load generator {number + 1} of {len(self._channels)}" + (f" (at {peer})" if peer else "")

    def _receive(self, number: int, read: Callable[[wire.Channel, float], _T], due: float, why: str) -> _T:
        """What `read` reads from a generator by `due` (monotonic) plus the margin, else GeneratorError."""
        margin = self.reply_margin_seconds
        try:
            return read(self._channels[number], due + margin)
        except wire.DeadlinePassed:
            raise GeneratorError(
                f"{self._name(number)} did not send {why}, nor in {margin:g} s more: the level ends without it "
                "(its process, pod or node is gone, or it cannot keep up)"
            ) from None
        except (wire.WireError, OSError) as exc:
            raise GeneratorError(f"{self._name(number)}: {exc}") from None

    def _send(self, number: int, message: wire.Message) -> None:
        try:
            self._channels[number].send(message)
        except (wire.WireError, OSError) as exc:
            raise GeneratorError(f"load generator {number + 1} of {self.count} stopped answering: {exc}") from None

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
        for channel in self._channels:
            with contextlib.suppress(OSError):  # a generator that died has closed its end
                channel.send(messages.STOP)
            channel.close()
        self._channels = []
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()

    def __enter__(self) -> GeneratorPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _clock_offset(channel: wire.Channel, timeout_seconds: float, rounds: int = 5) -> float:
    """The other end's clock minus this one's, from the round trip with the least delay (each answer due
    within `timeout_seconds`)."""
    best: tuple[float, float] | None = None
    for _ in range(rounds):
        sent = time.time()
        channel.send(messages.clock())
        theirs = messages.read_clock(channel.recv(timeout_seconds))
        answered = time.time()
        if best is None or answered - sent < best[0]:
            best = (answered - sent, theirs - (sent + answered) / 2)
    assert best is not None
    return best[1]
