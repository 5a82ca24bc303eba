"""The axes a ServingSweep varies (its `spec.space`): integer ranges, precisions, the handler's data path,
the server kinds, and a server's own knob axes (`perKind`). Parts of :mod:`servinglab.api.sweep`, which
expands them into configurations.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from servinglab.api.datapath import CompileMode, Decode, Transfer
from servinglab.api.forms import ModelForm
from servinglab.api.meta import SpecModel
from servinglab.api.servers import Precision, ServerKind

#: The data path's axes: each a field of `server.dataPath` (and of SweepSpace under the same name).
DATA_PATH_AXES = ("decode", "decode_threads", "transfer", "pinned_copies", "compile", "channels_last")


class IntAxis(SpecModel):
    """One integer axis: explicit `values`, or a range `min`..`max` in powers of two or linear steps."""

    values: list[int] | None = Field(default=None, min_length=1, max_length=64)
    min: int | None = Field(default=None, ge=1)
    max: int | None = Field(default=None, ge=1)
    scale: Literal["pow2", "linear"] = Field(default="pow2", description="Range form: powers of two, or steps.")
    step: int = Field(default=1, ge=1, description="Range form with scale linear: the step.")

    @model_validator(mode="after")
    def _one_form(self) -> IntAxis:
        has_range = self.min is not None or self.max is not None
        if (self.values is None) == (not has_range):
            raise ValueError("give either values or min and max")
        if has_range and (self.min is None or self.max is None or self.min > self.max):
            raise ValueError(f"min {self.min} and max {self.max} must both be set, min <= max")
        if self.values is not None and len(set(self.values)) != len(self.values):
            raise ValueError(f"values {self.values} repeat a value")
        return self

    def expand(self) -> list[int]:
        """The axis' values, ascending."""
        if self.values is not None:
            return sorted(self.values)
        assert self.min is not None and self.max is not None
        if self.scale == "linear":
            return list(range(self.min, self.max + 1, self.step))
        first = (self.min - 1).bit_length()  # smallest power of two >= min
        return [2**i for i in range(first, self.max.bit_length()) if self.min <= 2**i <= self.max]


class PrecisionAxis(SpecModel):
    """The precisions to try."""

    values: list[Precision] = Field(min_length=1, max_length=4)


class DecodeAxis(SpecModel):
    """Where to decode: cpu, device."""

    values: list[Decode] = Field(min_length=1, max_length=2)


class TransferAxis(SpecModel):
    """What crosses to the device: uint8, float."""

    values: list[Transfer] = Field(min_length=1, max_length=2)


class CompileAxis(SpecModel):
    """torch.compile modes to try (none: eager)."""

    values: list[CompileMode] = Field(min_length=1, max_length=5)


class BoolAxis(SpecModel):
    """A switch: [false, true], or one of them."""

    values: list[bool] = Field(min_length=1, max_length=2)


class FormAxis(SpecModel):
    """The model's forms to try (`server.form`): eager, torchscript, compile, onnxruntime, tensorrt."""

    values: list[ModelForm] = Field(min_length=1, max_length=5)

    @field_validator("values")
    @classmethod
    def _distinct(cls, value: list[ModelForm]) -> list[ModelForm]:
        if len(set(value)) != len(value):
            raise ValueError(f"values {[str(v) for v in value]} repeat a form")
        return value


class KnobSpace(SpecModel):
    """The server knobs to vary; a knob left out keeps the template's value."""

    batch_size: IntAxis | None = None
    max_batch_delay_ms: IntAxis | None = None
    workers: IntAxis | None = None
    precision: PrecisionAxis | None = None


class KindAxis(SpecModel):
    """The servers to compare, each searched to its own best configuration."""

    values: list[ServerKind] = Field(min_length=1, max_length=8)

    @field_validator("values")
    @classmethod
    def _distinct(cls, value: list[ServerKind]) -> list[ServerKind]:
        if len(set(value)) != len(value):
            raise ValueError(f"values {value} repeat a server")
        return value


class SweepSpace(KnobSpace):
    """The axes to vary; an axis left out keeps the template's value. With `kind`, each server is a space of
    its own: the axes here, or those of `perKind.<server>` (knob by knob) where a knob's useful values
    differ on that server. The data path's axes combine into the data paths tried (on every server); a
    combination that means nothing (device decode with decode threads, float transfer or pinned copies)
    is left out rather than run; so is a form the rest of the configuration cannot run (onnxruntime at
    fp16, a GPU-only form with gpus 0, a form other than compile with dataPath.compile set), listed with
    its reason among the sweep's pruned configurations."""

    decode: DecodeAxis | None = None
    decode_threads: IntAxis | None = None
    transfer: TransferAxis | None = None
    pinned_copies: BoolAxis | None = None
    compile: CompileAxis | None = None
    channels_last: BoolAxis | None = None
    form: FormAxis | None = None
    kind: KindAxis | None = None
    per_kind: dict[str, KnobSpace] = Field(
        default_factory=dict, description="Knob axes for one server of the kind axis, replacing the shared ones."
    )

    @model_validator(mode="after")
    def _kinds_known(self) -> SweepSpace:
        kinds = self.kind.values if self.kind is not None else []
        for name in self.per_kind:
            if name not in kinds:
                raise ValueError(f"perKind.{name}: not a server of the kind axis ({', '.join(kinds) or 'none'})")
        return self
