"""A local server's GPUs over a measured window, read through NVML (`nvidia-ml-py`), the way DCGM reports
them on a cluster: utilisation average and maximum, memory used maximum, average power, energy.

Energy is the difference of the device's total-energy counter between the window's edges (exact), and
the average power is that energy over the window's length. Utilisation comes from the samples the driver
buffers (`nvmlDeviceGetSamples`, about six a second), collected at the window's edges and at every
progress tick in between (the driver's buffer holds a limited span, so a long window is read in pieces);
memory used is read at the same moments and its maximum kept. Several GPUs: utilisation averaged, memory
and energy summed.

Without a GPU, without NVML or with a driver that refuses, :func:`open_gpus` says why and nothing is
measured: a run never fails for want of telemetry. Used by :mod:`servinglab.measure.telemetry`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from servinglab.api.figures import GpuFigures

#: nvmlValueType_t -> the member of nvmlValue_t that holds a sample.
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


@dataclass
class GpuWindow:
    """What was read of the GPUs between a window's edges (per device where it is per device)."""

    started: float
    energy_mj_start: list[float | None]
    utilization: list[float] = field(default_factory=list)
    memory_mib: list[float] = field(default_factory=list)
    last_seen_us: list[int] = field(default_factory=list)


def figures(window: GpuWindow, energy_mj_end: list[float | None], ended: float) -> GpuFigures:
    """The window's figures from what was read (pure): None where nothing was read."""
    seconds = max(ended - window.started, 1e-9)
    deltas = [end - start for start, end in zip(window.energy_mj_start, energy_mj_end, strict=True)
              if start is not None and end is not None]  # fmt: skip
    energy = sum(deltas) / 1000 if deltas and len(deltas) == len(energy_mj_end) else None
    utilization = window.utilization
    return GpuFigures(
        utilization_avg_percent=round(sum(utilization) / len(utilization), 3) if utilization else None,
        utilization_max_percent=max(utilization) if utilization else None,
        memory_used_max_mib=max(window.memory_mib) if window.memory_mib else None,
        power_avg_watts=round(energy / seconds, 3) if energy is not None else None,
        energy_joules=round(energy, 3) if energy is not None else None,
    )


def device_indexes(count: int) -> list[str]:
    """The NVML devices a local server with `count` GPUs uses: CUDA_VISIBLE_DEVICES' first `count`
    entries (indexes or UUIDs), else the first `count` devices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(index) for index in range(count)]
    return [entry.strip() for entry in visible.split(",") if entry.strip() and entry.strip() != "-1"][:count]


class NvmlGpus:
    """The server's GPUs through NVML; every call after :func:`open_gpus` may fail only into a note."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._handles = handles
        self.failure: str | None = None

    def _each(self, read: Any) -> list[Any]:
        found = []
        for handle in self._handles:
            try:
                found.append(read(handle))
            except self._nvml.NVMLError as exc:
                self.failure = self.failure or f"NVML: {exc}"
                found.append(None)
        return found

    def _energy(self) -> list[float | None]:
        return [None if v is None else float(v) for v in self._each(self._nvml.nvmlDeviceGetTotalEnergyConsumption)]

    def start(self) -> GpuWindow:
        now = time.time()
        seen = [int(now * 1e6)] * len(self._handles)
        window = GpuWindow(started=now, energy_mj_start=self._energy(), last_seen_us=seen)
        self.tick(window)
        return window

    def tick(self, window: GpuWindow) -> None:
        """Collect the utilisation samples buffered since the last read, and the memory used now."""
        nvml = self._nvml
        for index, handle in enumerate(self._handles):
            try:
                kind, samples = nvml.nvmlDeviceGetSamples(handle, nvml.NVML_GPU_UTILIZATION_SAMPLES,
                                                          window.last_seen_us[index])  # fmt: skip
                member = _VALUE_FIELDS[int(kind)] if 0 <= int(kind) < len(_VALUE_FIELDS) else "uiVal"
                fresh = [s for s in samples if s.timeStamp > window.last_seen_us[index]]
                window.utilization += [float(getattr(s.sampleValue, member)) for s in fresh]
                if fresh:
                    window.last_seen_us[index] = max(s.timeStamp for s in fresh)
            except nvml.NVMLError as exc:  # NOT_FOUND: no new sample since the last read
                if getattr(exc, "value", None) != getattr(nvml, "NVML_ERROR_NOT_FOUND", -1):
                    self.failure = self.failure or f"NVML utilisation samples: {exc}"
        used = self._each(lambda handle: nvml.nvmlDeviceGetMemoryInfo(handle).used)
        if all(value is not None for value in used):
            window.memory_mib.append(round(sum(used) / 2**20, 1))

    def end(self, window: GpuWindow) -> GpuFigures:
        self.tick(window)
        return figures(window, self._energy(), time.time())


def open_gpus(count: int) -> tuple[NvmlGpus | None, str]:
    """The server's GPUs through NVML, or None; and a note saying which, or why there are no figures."""
    if count == 0:
        return None, "no GPU figures: the server ran on the CPU"
    try:
        import pynvml
    except ImportError:
        return None, "no GPU figures: NVML's Python binding (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
        handles = []
        for entry in device_indexes(count):
            by_uuid = entry.startswith(("GPU-", "MIG-"))
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(entry) if by_uuid else
                           pynvml.nvmlDeviceGetHandleByIndex(int(entry)))  # fmt: skip
    except (pynvml.NVMLError, ValueError) as exc:
        return None, f"no GPU figures: NVML could not be read ({exc})"
    return NvmlGpus(pynvml, handles), f"GPU figures from NVML ({len(handles)} device(s)), sampled over each window"
