"""What the model alone measured: per batch size a row or a skip reason, and a cache a sweep's trials
share so each size is measured once (plain data; the probe fills it, the ceiling reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from servinglab.api.ceiling import RawRow


@dataclass
class RawFigures:
    """What one probe (or the cache) knows: per batch size, a measured row or a skip reason."""

    device: str
    measured: dict[int, RawRow] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)
    setup_seconds: float = 0.0
    measure_seconds: float = 0.0
    from_cache: list[int] = field(default_factory=list)


#: (model, precision, device kind, batch size, the model's side of the data path: compile, channels-last)
CacheKey = tuple[str, str, str, int, str]


@dataclass
class RawCache:
    """Measured rows and skip reasons by (model, precision, device, batch size, model options): a sweep's trials
    measure each size once, and do not spend their budget again on a size already skipped."""

    rows: dict[CacheKey, RawRow] = field(default_factory=dict)
    skipped: dict[CacheKey, str] = field(default_factory=dict)
    device_names: dict[str, str] = field(default_factory=dict)
