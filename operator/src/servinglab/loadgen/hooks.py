"""The callbacks a load run makes while it measures, shared by the closed and open loops.

Progress ticks feed the console; the window hooks fire exactly at the start and end of each level's
measured window (with the level's index in the run), so the caller can read the server's own
metrics for that window. The local runner and `servinglab loadtest` fill them in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
