"""What the raw probe's parent and its children (:mod:`.child`, :mod:`.forms`) say to each other, typed.

The request goes to a child as one JSON argument; the child answers one JSON event a line on stdout. Both
sides build and read these models, so a field is named once; each line is validated once, where it is
read (:mod:`.probe`). No torch here: the parent imports this too. The measured rows themselves are the
results' :class:`~servinglab.api.ceiling.RawRow` and :class:`~servinglab.api.ceiling.FormAlone`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter
from pydantic.alias_generators import to_camel

from servinglab.api.ceiling import RawRow

#: The data path's settings that change the model itself (`compile`, `channelsLast`, `formFile`,
#: `batchSize`), as the spec gives them (camelCase): handed as they are to the handler's own planner.
DataPathSettings = dict[str, JsonValue]


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    def argument(self) -> str:
        """The request as the child's one command-line argument."""
        return self.model_dump_json(by_alias=True)


class RawRequest(_Wire):
    """The model alone at `batch_sizes` (the first first) within `seconds`: :mod:`.child`."""

    model: str
    precision: str
    device: str
    batch_sizes: list[int]
    seconds: float
    data_path: DataPathSettings = {}


class FormsRequest(_Wire):
    """The model alone in each of `forms` at `batch_size`, built under `cache_dir`: :mod:`.forms`."""

    model: str
    precision: str
    device: str
    forms: list[str]
    batch_size: int
    seconds: float
    cache_dir: str | None = None


# -- what the children answer (the parent reads the fields it uses; the rest is for whoever reads the lines)


class _Event(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class Ready(_Event):
    event: Literal["ready"]
    device: str


class Start(_Event):
    event: Literal["start"]
    batch_size: int


class Measured(RawRow):
    event: Literal["measured"]

    def row(self) -> RawRow:
        return RawRow.model_validate(self.model_dump(exclude={"event"}))


class Skipped(_Event):
    event: Literal["skipped"]
    batch_size: int
    reason: str


class Done(_Event):
    event: Literal["done"]
    measure_seconds: float = 0.0


class Form(_Event):
    """One form's outcome, as :class:`~servinglab.api.ceiling.FormAlone` keeps it."""

    event: Literal["form"]
    form: str
    status: str
    throughput_rps: float | None = None
    build_seconds: float | None = None
    cached: bool | None = None
    reason: str | None = None


#: Any line either child prints, told apart by its `event`.
Event = Annotated[Ready | Start | Measured | Skipped | Done | Form, Field(discriminator="event")]
EVENT: TypeAdapter[Event] = TypeAdapter(Event)
