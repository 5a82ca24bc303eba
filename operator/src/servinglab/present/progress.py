"""Load progress on the console: live bars on a terminal, one line per phase change in logs and pipes.

The local runner and the local sweep report through its two callbacks (phase messages, per-tick
progress); the command line owns it.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

console = Console(stderr=True)


class LoadProgress:
    """Load progress: live bars on a terminal; one line per phase change in logs and pipes."""

    def __init__(self) -> None:
        self._live = console.is_terminal
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeRemainingColumn(),
            console=console,
            auto_refresh=False,  # refreshed from the load loop: no extra thread beside gevent
            disable=not self._live,
        )
        self._tasks: dict[tuple[str, str], Any] = {}

    def __enter__(self) -> LoadProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def phase(self, message: str) -> None:
        console.print(message, highlight=False)
        self._progress.refresh()

    def update(self, level: str, phase: str, done: float, planned: float, measured: int) -> None:
        key = (level, phase)
        if phase == "drain":
            return
        if key not in self._tasks:
            verb = {"warmup": "warm-up", "measure": "measuring", "extend": "extending (unstable)"}.get(phase, phase)
            self._tasks[key] = self._progress.add_task(f"{level:<8} {verb}", total=planned or 1, detail="")
            self._line(f"{level}: {verb} for {planned:g} s")
        detail = f"{measured} req" if phase == "measure" else ""
        self._progress.update(self._tasks[key], completed=done, detail=detail)
        self._progress.refresh()

    def _line(self, message: str) -> None:
        if not self._live:
            console.print(message, highlight=False)
