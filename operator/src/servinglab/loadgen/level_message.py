"""A generator's measured level as it crosses to the coordinator: the `done` message of
:mod:`servinglab.loadgen.messages`, a typed model whose parts are the results' own (camelCase on the
wire), validated once where it arrives."""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic
from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from servinglab.api.figures import GeneratorVerdict, Latency, OpenLoopFigures, PhaseFigures, Repeats, Stability
from servinglab.api.load import MAX_PHASES
from servinglab.loadgen.stats import CDF_STEP_PERCENT, LevelStats, Sample

#: Longest text field (URLs, content types, error kinds, phase names).
MAX_TEXT = 4096
#: Longest error kind of a sample (`connection:<exception name>`, `http_<status>`, ...).
MAX_ERROR_KIND = 200
#: Most distinct error kinds one level may count (HTTP statuses, connection errors, timeouts, checks).
MAX_ERROR_KINDS = 1000

ErrorKind = Annotated[str, Field(min_length=1, max_length=MAX_ERROR_KIND)]
CdfPoint = Annotated[list[float], Field(min_length=2, max_length=2)]


class LevelMessage(pydantic.BaseModel):
    """The `done` message: a generator's level as it measured it (its LevelStats but the samples, which
    follow). Read strictly (JSON's own types: no true for a count, no text for a number), every number
    finite, the text and lists a peer controls bounded, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              allow_inf_nan=False, str_max_length=MAX_TEXT)  # fmt: skip

    kind: Literal["done"] = "done"
    concurrency: int | None = None
    requests: int
    errors: int
    errors_by_kind: Annotated[dict[ErrorKind, int], Field(max_length=MAX_ERROR_KINDS)]
    throughput_rps: float
    window_seconds: float
    latency_ms: Latency
    window_start: float
    window_end: float
    latency_cdf_ms: Annotated[list[CdfPoint], Field(max_length=round(100 / CDF_STEP_PERCENT) + 1)]
    stability: Stability | None = None
    generator: GeneratorVerdict | None = None
    rate_rps: float | None = None
    open_loop: OpenLoopFigures | None = None
    repeats: Repeats | None = None
    phases: Annotated[list[PhaseFigures], Field(max_length=MAX_PHASES + 2)] | None = None  # + all bursts, all bases

    @pydantic.field_validator("generator")
    @classmethod
    def _judged_again(cls, verdict: GeneratorVerdict | None) -> GeneratorVerdict | None:
        """The coordinator judges each generator again: its CPU and send gaps must be there."""
        if verdict is not None and (verdict.cpu_percent is None or verdict.send_gap_ms is None):
            raise ValueError("a generator's verdict without its cpuPercent and sendGapMs")
        return verdict

    @classmethod
    def of(cls, stats: LevelStats) -> LevelMessage:
        return cls(**{name: getattr(stats, name) for name in FIGURES})

    def stats(self, samples: tuple[Sample, ...]) -> LevelStats:
        """The level as the generator measured it, with its samples."""
        return LevelStats(**{name: getattr(self, name) for name in FIGURES}, samples=samples)


#: The LevelStats fields a `done` message carries: all but the samples.
FIGURES = [name for name in LevelMessage.model_fields if name != "kind"]
