"""A local server's device figures over a window: the workers' CPU (used, and used or waited for), and the
GPU through NVML — which, on a machine without one, reports nothing and says why, never failing the run.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from servinglab.measure.nvml import GpuWindow, figures, open_gpus
from servinglab.measure.telemetry import LocalTelemetry


@pytest.fixture()
def burner_and_sleeper() -> Iterator[tuple[int, int]]:
    """Two real processes: one computing flat out on one thread, one asleep."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield burner.pid, sleeper.pid
    finally:
        for process in (burner, sleeper):
            process.kill()
            process.wait()


def test_a_computing_worker_wants_a_core_even_when_a_busy_machine_gives_it_less(
    burner_and_sleeper: tuple[int, int],
) -> None:
    burner, sleeper = burner_and_sleeper
    found = {}
    for name, pid in (("burner", burner), ("sleeper", sleeper)):
        telemetry = LocalTelemetry(lambda pid=pid: [pid], gpus=0)
        telemetry.window_start(0)
        time.sleep(1.0)
        telemetry.window_end(0)
        found[name] = telemetry.cpu[0]
        assert telemetry.note == "no GPU figures: the server ran on the CPU" and telemetry.gpu == {}
    burning, sleeping = found["burner"], found["sleeper"]
    # on this shared 2-core machine the burner gets what the scheduler gives it, but it wants one core:
    # the time it ran plus the time it waited to run is about the window
    assert burning.cores_wanted is not None and 0.8 <= burning.cores_wanted <= 1.2, burning
    assert 0.02 <= burning.cores_busy <= burning.cores_wanted + 0.05
    assert sleeping.cores_busy < 0.02 and (sleeping.cores_wanted or 0) < 0.02, sleeping
    assert burning.cores >= 1


def test_without_nvml_or_a_gpu_there_are_no_gpu_figures_and_a_note_says_why() -> None:
    assert open_gpus(0) == (None, "no GPU figures: the server ran on the CPU")
    gpus, note = open_gpus(1)  # this machine has no GPU: no binding, or NVML finds no driver
    assert gpus is None and note.startswith("no GPU figures: NVML"), note


def test_gpu_figures_of_a_window_from_what_nvml_gave() -> None:
    window = GpuWindow(started=100.0, energy_mj_start=[1_000_000.0, 2_000_000.0], utilization=[80.0, 90.0, 100.0],
                       memory_mib=[1000.0, 1500.0], last_seen_us=[0, 0])  # fmt: skip
    found = figures(window, [1_150_000.0, 2_150_000.0], ended=102.0)  # two GPUs, 150 J each over 2 s
    assert found.utilization_avg_percent == 90.0 and found.utilization_max_percent == 100.0
    assert found.memory_used_max_mib == 1500.0
    assert found.energy_joules == 300.0 and found.power_avg_watts == 150.0
    unread = figures(GpuWindow(started=0.0, energy_mj_start=[None]), [None], ended=1.0)
    assert unread.energy_joules is None and unread.utilization_avg_percent is None and unread.power_avg_watts is None
