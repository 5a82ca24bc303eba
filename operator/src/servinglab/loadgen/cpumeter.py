"""How busy the load generator's own event loop was over a level (it judges whether the generator, not
the server, limited the load: :func:`servinglab.loadgen.stats.generator_verdict`). Used by the closed
and open loops."""

from __future__ import annotations

import time

import psutil


class CpuMeter:
    """How busy this thread (the generator's event loop) was since creation, as a percentage of one
    core over the wall time: the time it ran on a core *or waited in the run queue for one*.

    CPU time alone reads low for a generator that never idles but shares its core with other busy
    processes (a contended host or node, a CPU-throttled pod): it gets less CPU because others take
    it, not because it has time to spare, and a starved generator would pass for a calm one. Linux's
    scheduler statistics (/proc/thread-self/schedstat) give both times; without them (another OS, a
    kernel without them) it falls back to the process's CPU time.
    """

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._schedstat = _schedstat_seconds() is not None
        self._busy = self._used()
        self._wall = time.monotonic()

    def _used(self) -> float:
        if self._schedstat and (busy := _schedstat_seconds()) is not None:
            return busy
        times = self._process.cpu_times()
        return float(times.user + times.system)

    def percent(self) -> float:
        wall = time.monotonic() - self._wall
        return 100.0 * (self._used() - self._busy) / wall if wall > 0 else 0.0


def _schedstat_seconds() -> float | None:
    """This thread's time on a core plus its time waiting for one, in seconds (None: not readable).
    Read by the thread measured: the event loop's, which the meter is created and read in."""
    try:
        with open("/proc/thread-self/schedstat") as schedstat:
            on_cpu_ns, waiting_ns = schedstat.read().split()[:2]
        return (int(on_cpu_ns) + int(waiting_ns)) / 1e9
    except (OSError, ValueError):
        return None
