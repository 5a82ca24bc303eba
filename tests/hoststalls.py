"""Whether this host stayed quiet while a timing-sensitive test ran.

On a shared machine (CI runs two test sessions at once on 2 cores) another process can hold the CPU
for tens of milliseconds, and then *any* load generator sends late. Tests assert strict timeliness
on a quiet host only; on a busy one they assert that the lateness was told, not hidden. Two signs,
both needed for quiet (integration/tools/host_stalls.py watches both): the watcher's own oversleeps
(it can miss a stall that another process had), and Linux's CPU pressure (the share of the time
some runnable task waited for a CPU, whichever task it was).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TOOL = Path(__file__).parent / "integration" / "tools" / "host_stalls.py"
# A quiet host: no scheduling stall over 25 ms and at most a few over 10 ms (the generator's own
# send-gap limit) while a probe ran. An idle 2-core VM here shows 1-5 stalls of 10-20 ms in 5 s.
QUIET_HOST_MAX_STALL_MS = 25.0
QUIET_HOST_STALLS_OVER_10_MS = 5
# ...and no task waited for a CPU more than a tenth of the time (two busy loops on 2 cores: 70-95 %).
QUIET_HOST_MAX_CPU_PRESSURE = 0.10


@dataclass
class HostWatch:
    """What the watcher saw (filled in when the watched block ends): stalls over 10 ms as (epoch
    time, ms), and CPU pressure readings as (epoch time, microseconds waited since boot)."""

    stalls: list[tuple[float, float]] = field(default_factory=list)
    pressure: list[tuple[float, int]] = field(default_factory=list)

    @property
    def quiet(self) -> bool:
        return self.quiet_during(0.0, float("inf"))

    def quiet_during(self, start: float, end: float) -> bool:
        """Whether the host was quiet between two epoch times (a level's measured window)."""
        stalls = [ms for at, ms in self.stalls if start <= at <= end]
        if max(stalls, default=0.0) > QUIET_HOST_MAX_STALL_MS or len(stalls) > QUIET_HOST_STALLS_OVER_10_MS:
            return False
        readings = [(at, waited) for at, waited in self.pressure if start <= at <= end]
        if len(readings) < 2 or readings[-1][0] <= readings[0][0]:
            return True  # no pressure information: the stalls decide
        (first, waited_first), (last, waited_last) = readings[0], readings[-1]
        return (waited_last - waited_first) / 1e6 / (last - first) <= QUIET_HOST_MAX_CPU_PRESSURE


@contextlib.contextmanager
def watching_host() -> Iterator[HostWatch]:
    """Watch the host's scheduling for as long as the block runs."""
    watcher = subprocess.Popen([sys.executable, str(TOOL)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    watch = HostWatch()
    try:
        yield watch
    finally:
        seen = json.loads(watcher.communicate(timeout=10)[0])
    watch.stalls = [(at, ms) for at, ms in seen["stalls"]]
    watch.pressure = [(at, waited) for at, waited in seen["pressure"]]
