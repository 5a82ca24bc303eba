"""A server's Prometheus counters read at a measured window's edges: the totals of the counters its
breakdown needs (:func:`totals`), and the differences and means between two reads (:class:`Window`).
Shared by the servers' metrics modules (pure)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from servinglab.api.figures import ServerBreakdown
from servinglab.api.results import EffectiveSettings

#: Each counter of interest, summed over its series, by its name without `_total`.
Snapshot = dict[str, float]


def totals(text: str, names: Sequence[str], model_name: str | None, model_labels: Sequence[str]) -> Snapshot:
    """Each counter in `names` summed over its series; with `model_name`, only the series whose first
    present label of `model_labels` names that model (a series without one counts: it is the server's)."""
    found: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name not in names:
                continue
            series_model = next((sample.labels[label] for label in model_labels if label in sample.labels), None)
            if model_name is not None and series_model not in (None, model_name):
                continue
            found[name] += sample.value
    return {name: found.get(name, 0.0) for name in names}


@dataclass(frozen=True)
class Window:
    """Two reads of the counters, at a measured window's start and end."""

    before: Snapshot
    after: Snapshot

    def delta(self, name: str) -> float:
        return self.after.get(name, 0.0) - self.before.get(name, 0.0)

    @staticmethod
    def per(total: float, count: float, scale: float = 1.0) -> float | None:
        """A mean over the window (rounded to 3 places); None where the window saw no such events."""
        return round(total / count * scale, 3) if count > 0 else None


@dataclass(frozen=True)
class ModelCounters:
    """A server's :class:`~servinglab.servers.base.ServerMetrics` for one model from its pure `parse` and
    `breakdown`, for a server whose metrics do not say how it batches (its own API does, or nothing)."""

    model_name: str
    parse: Callable[[str, str | None], Snapshot]
    window: Callable[[Snapshot, Snapshot], ServerBreakdown]

    def snapshot(self, text: str) -> object:
        return self.parse(text, self.model_name)

    def breakdown(self, before: object, after: object) -> ServerBreakdown:
        assert isinstance(before, dict) and isinstance(after, dict)
        return self.window(before, after)

    def effective(self, text: str) -> EffectiveSettings | None:
        return None
