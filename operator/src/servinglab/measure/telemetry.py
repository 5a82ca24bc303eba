"""A local server's device figures over each measured window: its workers' CPU, and its GPUs (NVML).

The CPU figures are those of the processes that run the model (the server names them:
:meth:`servinglab.servers.base.LocalServer.worker_process_ids`), between the window's edges, per second of
the window: the CPU time they used, and — from Linux's per-thread scheduler statistics
(`/proc/<pid>/task/<tid>/schedstat`) — the time they used or spent runnable in the run queue. On a shared
machine a worker that computes waits for a core while one that sleeps or waits on a device does not, so
the second figure tells the verdict's compute-bound from queue-bound where no GPU figure does. The GPU
figures are NVML's (:mod:`servinglab.measure.nvml`). The measurement driver calls :meth:`window_start`
and :meth:`window_end` exactly at a level's edges and :meth:`tick` on its progress ticks; nothing here
raises for want of a figure.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import psutil

from servinglab.api.figures import GpuFigures
from servinglab.api.verdicts import CpuFigures
from servinglab.measure.nvml import GpuWindow, open_gpus

K = TypeVar("K")


@dataclass(frozen=True)
class CpuRead:
    """CPU seconds so far per process, and per thread (pid, tid) seconds on a CPU plus in the run queue
    (empty where the kernel has no schedstat)."""

    used: dict[int, float]
    wanted: dict[tuple[int, int], float]


def read_cpu(pids: list[int]) -> CpuRead:
    used: dict[int, float] = {}
    wanted: dict[tuple[int, int], float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            used[pid] = times.user + times.system
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    on_cpu, waiting = (task / "schedstat").read_text().split()[:2]
                    wanted[(pid, int(task.name))] = (int(on_cpu) + int(waiting)) / 1e9
    return CpuRead(used, wanted)


def per_second(before: Mapping[K, float], after: Mapping[K, float], seconds: float) -> float:
    """Seconds counted between two reads, per second (a process or thread born in between counts from zero)."""
    counted = sum(max(total - before.get(key, 0.0), 0.0) for key, total in after.items())
    return counted / seconds if seconds > 0 else 0.0


def usable_cores() -> int:
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class LocalTelemetry:
    """Per level (by index in the run): the server's CPU figures and, with GPUs, NVML's."""

    def __init__(self, process_ids: Callable[[], list[int]], gpus: int) -> None:
        self._process_ids = process_ids
        self._gpus, self.note = open_gpus(gpus)
        self._cores = usable_cores()
        self._cpu_before: dict[int, tuple[float, CpuRead]] = {}
        self._gpu_open: dict[int, GpuWindow] = {}
        self.cpu: dict[int, CpuFigures] = {}
        self.gpu: dict[int, GpuFigures] = {}

    def resource(self, asked: str) -> Literal["gpu", "cpu"]:
        """The resource a utilisation target reads: the one asked for; for `auto` the GPU where NVML shows the
        server's, else the CPU."""
        if asked == "gpu" or (asked == "auto" and self._gpus is not None):
            return "gpu"
        return "cpu"

    def utilisation(self, level: int, resource: Literal["gpu", "cpu"]) -> float | None:
        """The share of the resource the server used over the level's window (None: unread): the GPU's mean
        utilisation; or its workers' CPU seconds per second over the cores it may run on (waits in the run
        queue are not use)."""
        if resource == "gpu":
            gpu = self.gpu.get(level)
            return gpu.utilization_avg_percent / 100 if gpu and gpu.utilization_avg_percent is not None else None
        cpu = self.cpu.get(level)
        return cpu.cores_busy / max(cpu.cores, 1) if cpu is not None else None

    def window_start(self, level: int) -> None:
        self._cpu_before[level] = (time.monotonic(), read_cpu(self._process_ids()))
        if self._gpus is not None:
            self._gpu_open[level] = self._gpus.start()

    def tick(self) -> None:
        if self._gpus is not None:
            for window in self._gpu_open.values():
                self._gpus.tick(window)

    def window_end(self, level: int) -> None:
        if level in self._cpu_before:
            started, before = self._cpu_before.pop(level)
            after = read_cpu(self._process_ids())
            seconds = time.monotonic() - started
            busy = per_second(before.used, after.used, seconds)
            wanted = per_second(before.wanted, after.wanted, seconds) if after.wanted else None
            self.cpu[level] = CpuFigures(
                cores_busy=round(busy, 3), cores_wanted=round(wanted, 3) if wanted is not None else None,
                cores=self._cores,
            )  # fmt: skip
        window = self._gpu_open.pop(level, None)
        if self._gpus is not None and window is not None:
            self.gpu[level] = self._gpus.end(window)
            if self._gpus.failure:
                self.note = f"{self.note}; {self._gpus.failure}"
                self._gpus.failure = None
