"""What a sweep varies and how it judges: one trial's configuration (the server settings it applies to the
template, and its short DNS-safe label), when a search stops, how the best is confirmed, and what it is
best at (the objective). Parts of the ServingSweep spec (:mod:`servinglab.api.sweep`); the trials' records,
the search and the roll-up read them. Nothing here imports the rest of servinglab.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from servinglab.api.datapath import DataPath
from servinglab.api.forms import FORM_LABELS, ModelForm
from servinglab.api.meta import SpecModel
from servinglab.api.servers import Precision, ServerKind

#: A configuration's key: batch, delay, workers, precision, data path label, server, form.
ConfigKey = tuple[int, int, int, str, str, str, str]
#: One variant of a configuration (the search's category): its precision, data path and form.
Variant = tuple[Precision, DataPath, ModelForm | None]


class TrialConfig(SpecModel):
    """One configuration: the server settings a trial applies to the template."""

    kind: ServerKind | None = Field(default=None, description="The server; unset: the template's.")
    batch_size: int = Field(ge=1, le=4096)
    max_batch_delay_ms: int = Field(ge=1, le=60_000)
    workers: int = Field(ge=1, le=64)
    precision: Precision
    data_path: DataPath | None = Field(
        default=None, description="The handler's data path (unset: its defaults; listed: the template's)."
    )
    form: ModelForm | None = Field(default=None, description="The model's form (server.form); unset: the template's.")

    @field_validator("data_path")
    @classmethod
    def _default_is_unset(cls, value: DataPath | None) -> DataPath | None:
        return None if value is not None and not value.label() else value  # one spelling of the defaults

    @property
    def path(self) -> DataPath:
        return self.data_path or DataPath()

    def path_for_people(self) -> str:
        return self.path.describe() if self.data_path is not None else "default"

    def key(self) -> ConfigKey:
        return (self.batch_size, self.max_batch_delay_ms, self.workers, str(self.precision), self.path.label(),
                self.kind or "", str(self.form or ""))  # fmt: skip

    def label(self) -> str:
        """Short, unique and DNS-safe: b8-d5-w1-fp32, the server first when the trial names one
        (litserve-b8-d5-w1-fp32), the data path's label last when it is not the handler's default
        (b8-d5-w1-fp32-t4-cd), and the form's mark after it when the trial names one (b8-d5-w1-fp32-ort)."""
        base = f"b{self.batch_size}-d{self.max_batch_delay_ms}-w{self.workers}-{self.precision}"
        base = f"{self.kind}-{base}" if self.kind else base
        path = self.path.label()
        base = f"{base}-{path}" if path else base
        return f"{base}-{FORM_LABELS[self.form]}" if self.form is not None else base


class StopSpec(SpecModel):
    """When a search stops before it has converged."""

    patience: int = Field(default=8, ge=1, le=500, description="Stop after this many trials without improvement.")
    min_improvement: float = Field(
        default=0.02, ge=0, le=1, description="An improvement smaller than this share of the best does not count."
    )


class ConfirmSpec(SpecModel):
    """Before the best is named, the top `candidates` are measured again `rounds` times, alternating them
    (A B C A B C ...), and the winner is named with an interval, or a tie when they cannot be told apart."""

    candidates: int = Field(default=3, ge=1, le=8, description="How many of the best trials are measured again.")
    rounds: int = Field(
        default=3, ge=0, le=10,
        description="How many times each is measured again (at least 2 to estimate the noise); 0: no confirmation, "
        "the best single measurement is named.",
    )  # fmt: skip

    @model_validator(mode="after")
    def _enough_rounds(self) -> ConfirmSpec:
        if self.rounds == 1:
            raise ValueError("rounds 1 cannot estimate the noise: give 2 or more, or 0 for no confirmation")
        return self


class ObjectiveSpec(SpecModel):
    """What the best configuration is best at, within the template's SLO: the most throughput, or the lowest
    cost per million inferences (at the capacity within the SLO; needs the template's `cost`)."""

    optimize: Literal["throughput", "cost"] = Field(
        default="throughput", description="throughput: the highest capacity within the SLO; cost: the lowest cost "
        "per million inferences there (template.cost.pricePerHour, or --price-per-hour locally).",
    )  # fmt: skip

    max_error_rate: float = Field(
        default=0.0, ge=0, le=1, description="A level may have at most this share of failed requests to count."
    )
