"""Open-loop schedules whose rate changes over time: step, burst and trace replay (pure, but for
reading a trace file).

A `Schedule` is every send time of one run, in seconds from its start: a warm-up at the first
phase's rate (excluded from every figure), then the measured phases back to back. Steady open-loop
levels are schedules too (one phase). Several generators split a schedule by taking every N-th send
(:meth:`Schedule.share`), so their union is the schedule exactly, a trace included.

Trace files are text, one request per line: `<seconds>[,<payload index>]` (comma or whitespace);
blank lines and `#` comments are skipped; times must not go backwards; the first time is the start.
A bad line is refused with its line number. A trace is read from the payload folder only
(:mod:`servinglab.loadgen.folder`) and is bounded: at most MAX_TRACE_BYTES, MAX_TRACE_LINES lines,
MAX_TRACE_SENDS sends and MAX_TRACE_SECONDS long as replayed, and no more stability windows than a
level may have (servinglab.api.load.MAX_WINDOWS_PER_LEVEL).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from servinglab.api import ShapeSpec, TraceShape
from servinglab.api.figures import PhaseFigures
from servinglab.api.load import MAX_WINDOWS_PER_LEVEL
from servinglab.loadgen import folder
from servinglab.loadgen.arrivals import arrival_offsets
from servinglab.loadgen.stats import Sample, rounded, summarise

#: The most a trace may be: bytes of text, lines (comments included), sends, and seconds as replayed
#: (as long as a burst run may be).
MAX_TRACE_BYTES = 64 << 20
MAX_TRACE_LINES = 2_000_000
MAX_TRACE_SENDS = 1_000_000
MAX_TRACE_SECONDS = 7200.0


class TraceError(ValueError):
    """The trace file is unreadable or has a bad line (named)."""


@dataclass(frozen=True)
class Phase:
    """A stretch of the measured run at one rate, in seconds from the measured start."""

    name: str
    start: float
    end: float
    rate_rps: float
    users: int | None = None  # a closed-loop step: the users held in it


@dataclass(frozen=True)
class Schedule:
    """Send times from the run's start (warm-up included) and what the measured part consists of."""

    offsets: tuple[float, ...]
    warmup_seconds: float
    measured_seconds: float
    phases: tuple[Phase, ...]
    payload_indices: tuple[int, ...] | None = None  # per send (a trace's own), else round robin
    kind: str = "steady"
    senders: int = field(default=1, compare=False)  # how many generators share it (see share)

    @property
    def mean_rate_rps(self) -> float:
        measured = sum(1 for offset in self.offsets if offset >= self.warmup_seconds)
        return measured / self.measured_seconds if self.measured_seconds > 0 else 0.0

    def share(self, number: int, count: int) -> Schedule:
        """Generator `number`'s part of `count`: every count-th send, starting with its own (a closed-loop
        step: its share of each step's users, split as evenly as they go)."""
        indices = self.payload_indices[number::count] if self.payload_indices is not None else None
        phases = tuple(
            dataclasses.replace(phase, users=split_users(phase.users, count)[number]) if phase.users is not None
            else phase
            for phase in self.phases
        )  # fmt: skip
        return dataclasses.replace(
            self, offsets=self.offsets[number::count], payload_indices=indices, senders=count, phases=phases
        )


def split_users(users: int, count: int) -> list[int]:
    """Users as evenly as they go, at most one apart; generators beyond `users` get none."""
    return [users // count + (1 if i < users % count else 0) for i in range(count)]


def steady(rate_rps: float, warmup_seconds: float, measured_seconds: float, arrival: str, seed: int) -> Schedule:
    """One rate held: the classic open-loop level."""
    offsets = arrival_offsets(rate_rps, warmup_seconds + measured_seconds, arrival, seed)
    return Schedule(tuple(offsets), warmup_seconds, measured_seconds, (Phase(f"{rate_rps:g} rps", 0.0,
                    measured_seconds, rate_rps),))  # fmt: skip


def build(shape: ShapeSpec, warmup_seconds: float, arrival: str, seed: int, trace_dir: Path | None = None,
          payload_count: int | None = None, window_seconds: float | None = None) -> Schedule:  # fmt: skip
    """The schedule of a shaped run (a trace is read from the payload folder `trace_dir`, default the
    working directory; see :func:`load_trace`)."""
    if shape.step is not None and shape.step.users is not None:  # closed loop: no send times, users per step
        step, users_per_step = shape.step, shape.step.users
        phases = [
            Phase(f"step {i + 1}: {users} users", i * step.step_seconds, (i + 1) * step.step_seconds, 0.0, users)
            for i, users in enumerate(users_per_step)
        ]
        return Schedule((), warmup_seconds, phases[-1].end, tuple(phases), kind="step")
    if shape.step is not None and shape.step.rates is not None:
        step, rates = shape.step, shape.step.rates
        phases = [
            Phase(f"step {i + 1}: {rate:g} rps", i * step.step_seconds, (i + 1) * step.step_seconds, rate)
            for i, rate in enumerate(rates)
        ]
        return _from_phases(phases, warmup_seconds, arrival, seed, "step")
    if shape.burst is not None:
        burst = shape.burst
        phases, start, number = [], 0.0, 1
        while start < burst.duration_seconds - 1e-9:
            calm_end = min(start + burst.period_seconds - burst.burst_seconds, burst.duration_seconds)
            phases.append(Phase(f"base {number}", start, calm_end, burst.base_rps))
            if calm_end < burst.duration_seconds - 1e-9:
                burst_end = min(calm_end + burst.burst_seconds, burst.duration_seconds)
                phases.append(Phase(f"burst {number}", calm_end, burst_end, burst.burst_rps))
            start, number = start + burst.period_seconds, number + 1
        return _from_phases(phases, warmup_seconds, arrival, seed, "burst")
    assert shape.trace is not None
    times, indices = load_trace(shape.trace, trace_dir or Path.cwd(), payload_count, window_seconds)
    offsets = [time / shape.trace.speed for time in times]
    measured = (offsets[-1] if offsets else 0.0) + 1e-6  # the last send is inside the measured period
    rate = len(offsets) / measured if measured > 0 else 0.0
    warm = arrival_offsets(rate, warmup_seconds, arrival, seed) if warmup_seconds > 0 and rate > 0 else []
    # the warm-up cycles through the trace's own payloads
    payloads = None if indices is None else tuple([*(indices[i % len(indices)] for i in range(len(warm))), *indices])
    return Schedule(
        tuple([*warm, *(warmup_seconds + offset for offset in offsets)]), warmup_seconds, measured,
        (Phase(f"trace x{shape.trace.speed:g}", 0.0, measured, rate),), payload_indices=payloads, kind="trace",
    )  # fmt: skip


def _from_phases(phases: list[Phase], warmup_seconds: float, arrival: str, seed: int, kind: str) -> Schedule:
    offsets = list(arrival_offsets(phases[0].rate_rps, warmup_seconds, arrival, seed)) if warmup_seconds > 0 else []
    for number, phase in enumerate(phases, start=1):
        sends = arrival_offsets(phase.rate_rps, phase.end - phase.start, arrival, seed + number)
        offsets += [warmup_seconds + phase.start + offset for offset in sends]
    return Schedule(tuple(offsets), warmup_seconds, phases[-1].end, tuple(phases), kind=kind)


_SPLIT = re.compile(r"[,\s]+")


def load_trace(
    trace: TraceShape, payload_dir: Path, payload_count: int | None = None, window_seconds: float | None = None
) -> tuple[list[float], list[int] | None]:
    """The spec's trace, read from the payload folder: send times from its first (not yet sped up) and
    its payload indices. TraceError if it is outside the folder, too long as replayed at its speed, or
    would cut its level into more than MAX_WINDOWS_PER_LEVEL windows of `window_seconds`."""
    try:
        path = folder.confined(payload_dir, trace.file, "load.shape.trace.file")
    except folder.FolderError as exc:
        raise TraceError(str(exc)) from None
    times, indices = read_trace(path, payload_count, shown=trace.file)
    seconds = times[-1] / trace.speed
    if seconds > MAX_TRACE_SECONDS:
        raise TraceError(
            f"trace {trace.file}: lasts {seconds:g} s replayed at speed {trace.speed:g}; "
            f"at most {MAX_TRACE_SECONDS:g} s"
        )
    if window_seconds is not None and seconds / window_seconds > MAX_WINDOWS_PER_LEVEL:
        raise TraceError(
            f"trace {trace.file}: {seconds:g} s replayed are {seconds / window_seconds:.0f} stability windows of "
            f"{window_seconds:g} s; at most {MAX_WINDOWS_PER_LEVEL} (load.stability.windowSeconds >= "
            f"{seconds / MAX_WINDOWS_PER_LEVEL:.3g})"
        )
    return times, indices


def read_trace(
    path: Path, payload_count: int | None = None, shown: str | None = None
) -> tuple[list[float], list[int] | None]:
    """Send times from the trace's first (seconds) and the payload index of each, if the trace gives
    them (all lines or none). `path` is read as it is: :func:`load_trace` confines it first."""
    name = shown or path.name
    try:
        text = folder.read_bounded(path, MAX_TRACE_BYTES, "load.shape.trace.file", f"trace {name}")
    except folder.FolderError as exc:
        raise TraceError(str(exc)) from None
    times: list[float] = []
    indices: list[int] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        where = f"trace {name} line {number}"
        if number > MAX_TRACE_LINES:
            raise TraceError(f"{where}: more than {MAX_TRACE_LINES} lines; at most that many")
        line = raw.decode("utf-8", errors="replace").split("#", 1)[0].strip()
        if not line:
            continue
        if len(times) == MAX_TRACE_SENDS:
            raise TraceError(f"{where}: more than {MAX_TRACE_SENDS} sends; at most that many")
        moment, index = _trace_line(line, where, payload_count)
        if times and moment < times[-1]:
            raise TraceError(f"{where}: {moment:g} s is before the previous line's {times[-1]:g} s")
        times.append(moment)
        if (index is not None) != bool(indices) and len(times) > 1:
            raise TraceError(f"{where}: payload indices must be given on every line or on none")
        if index is not None:
            indices.append(index)
    if not times:
        raise TraceError(f"trace {name}: no requests in it")
    start = times[0]
    return [moment - start for moment in times], (indices or None)


def _trace_line(line: str, where: str, payload_count: int | None) -> tuple[float, int | None]:
    """One line's send time and payload index (None: not given)."""
    fields = _SPLIT.split(line)
    if len(fields) > 2:
        raise TraceError(f"{where}: {line[:80]!r} has {len(fields)} fields; expected <seconds>[,<payload index>]")
    try:
        moment = float(fields[0])
    except ValueError:
        raise TraceError(f"{where}: {fields[0][:40]!r} is not a time in seconds") from None
    if not math.isfinite(moment):
        raise TraceError(f"{where}: {fields[0][:40]!r} is not a finite time")
    if len(fields) == 1:
        return moment, None
    if not (fields[1].isascii() and fields[1].isdigit()):
        raise TraceError(f"{where}: payload index {fields[1][:40]!r} is not a whole number >= 0")
    if len(fields[1]) > 12:
        raise TraceError(f"{where}: payload index {fields[1][:40]}... is past every payload")
    index = int(fields[1])
    if payload_count is not None and index >= payload_count:
        raise TraceError(f"{where}: payload index {index} is past the {payload_count} payloads")
    return moment, index


def phase_figures(samples: Sequence[Sample], measured_start: float, schedule: Schedule) -> list[PhaseFigures]:
    """Each phase's figures over the requests sent in it (exact, as for a level); a burst run adds
    every base and every burst phase taken together."""

    def figures(
        name: str,
        rate: float,
        chosen: list[Sample],
        seconds: float,
        users: int | None = None,
        start: float | None = None,
    ) -> PhaseFigures:
        stats = summarise(None, chosen)
        return PhaseFigures(
            name=name, start=start, users=users, rate_rps=round(rate, 3) if users is None else None,
            seconds=round(seconds, 3), requests=stats.requests, errors=stats.errors,
            throughput_rps=round(stats.throughput_rps, 3), latency_ms=rounded(stats.latency_ms),
        )  # fmt: skip

    by_phase: list[list[Sample]] = [[] for _ in schedule.phases]
    for sample in samples:
        offset = sample.sent_at - measured_start
        for number, phase in enumerate(schedule.phases):
            if phase.start <= offset < phase.end or (number == len(schedule.phases) - 1 and offset >= phase.end):
                by_phase[number].append(sample)
                break
    result = [
        figures(phase.name, phase.rate_rps, chosen, phase.end - phase.start, phase.users, round(phase.start, 3))
        for phase, chosen in zip(schedule.phases, by_phase, strict=True)
    ]
    if schedule.kind == "burst":
        for kind in ("base", "burst"):
            members = [i for i, phase in enumerate(schedule.phases) if phase.name.startswith(f"{kind} ")]
            seconds = sum(schedule.phases[i].end - schedule.phases[i].start for i in members)
            chosen = [sample for i in members for sample in by_phase[i]]
            result.append(figures(f"all {kind}", schedule.phases[members[0]].rate_rps, chosen, seconds))
    return result
