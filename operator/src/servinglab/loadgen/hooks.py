"""The callbacks a load run makes while it measures, shared by the closed and open loops.

Progress ticks feed the console; the window hooks fire exactly at the start and end of each level's
measured window (with the level's index in the run), so the caller can read the server's own
metrics for that window. The local runner and `servinglab loadtest` fill them in.

`LevelTiming` decides when a level's measured period starts and whether it goes on: a lone
generator decides for itself; one of several generator processes asks their coordinator, which
decides for all of them on their merged samples (:mod:`servinglab.loadgen.generators`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servinglab.api import StabilitySpec
from servinglab.loadgen.stats import Sample, extension_seconds

#: Progress callback: (level label e.g. "c=4" or "40 rps", phase "warmup"|"measure"|"extend"|"drain",
#: seconds done, seconds planned, measured requests so far).
ProgressFn = Callable[[str, str, float, float, int], None]
WindowHook = Callable[[int], None]


@dataclass(frozen=True)
class LevelHooks:
    progress: ProgressFn | None = None
    window_start: WindowHook | None = None
    window_end: WindowHook | None = None

    def report(self, label: str, phase: str, done: float, planned: float, measured: int) -> None:
        if self.progress is not None:
            self.progress(label, phase, done, planned, measured)

    def started(self, index: int) -> None:
        if self.window_start is not None:
            self.window_start(index)

    def ended(self, index: int) -> None:
        if self.window_end is not None:
            self.window_end(index)


class LevelTiming:
    """A lone generator's timing: measure from when it planned to, extend while it is unstable."""

    def measure_from(self, planned: float) -> float:
        """The epoch time the measured period starts, given when this generator would start it."""
        return planned

    def extend(self, samples: Sequence[Sample], start: float, measured: float, rule: StabilitySpec) -> float:
        """At the end of the measured period so far: seconds more to measure (0: stop)."""
        return extension_seconds(samples, start, measured, rule, time.time())
