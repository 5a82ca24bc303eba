"""The server's own counters read at both edges of every measured window, turned into its breakdown.

The load generator calls :meth:`WindowReader.window_start` and :meth:`WindowReader.window_end` exactly at
a level's measured window; the server's metrics (:class:`servinglab.servers.base.ServerMetrics`, behind
the seam) say what a scrape means. Used by the measurement driver, locally and in the load Job.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

from servinglab.api.figures import ServerBreakdown
from servinglab.servers.base import ServerMetrics


class WindowReader:
    """Scrapes a server's metrics at the start and end of each measured window and keeps each level's
    breakdown (by the level's index in the run)."""

    def __init__(self, fetch: Callable[[], str], metrics: ServerMetrics) -> None:
        self._fetch = fetch
        self._metrics = metrics
        self._before: dict[int, object] = {}
        self.breakdowns: dict[int, ServerBreakdown] = {}

    def window_start(self, level: int) -> None:
        self._before[level] = self._metrics.snapshot(self._fetch())

    def window_end(self, level: int) -> None:
        after = self._metrics.snapshot(self._fetch())
        self.breakdowns[level] = self._metrics.breakdown(self._before[level], after)


def http_fetcher(url: str, timeout: float = 10.0) -> Callable[[], str]:
    """A fetch function for :class:`WindowReader` reading `url` (the server's metrics endpoint)."""

    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text: str = response.read().decode()
            return text

    return fetch
