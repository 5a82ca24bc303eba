"""The server under test, as a spec names it: which server (one kind per folder of
:mod:`servinglab.servers`), and the batching, workers, precision, placement and limits it runs with.

Part of the ServingExperiment spec (:mod:`servinglab.api.experiment`); the servers' configuration
renderers and pod builders read it.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import Field, field_validator

from servinglab.api.meta import SpecModel

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


class Precision(StrEnum):
    """Numeric precision the handler runs the model in.

    fp32 is strict IEEE fp32 (TF32 explicitly off); tf32 allows TF32 matmuls/convolutions on GPUs
    that have them; fp16 and bf16 convert weights and inputs to that type (not autocast).
    """

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"


class Toleration(SpecModel):
    """A Kubernetes toleration, as in a pod spec."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)


class Resources(SpecModel):
    """CPU/memory requests and limits for the server container (GPUs come from `server.gpus`)."""

    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, value: dict[str, str]) -> dict[str, str]:
        for name, quantity in value.items():
            if name not in ("cpu", "memory", "ephemeral-storage"):
                raise ValueError(f"'{name}' is not one of cpu, memory, ephemeral-storage")
            if not _QUANTITY.match(str(quantity)):
                raise ValueError(f"{name}: '{quantity}' is not a Kubernetes quantity")
        return value


#: The model servers servinglab can put under test (each one a folder of :mod:`servinglab.servers`).
ServerKind = Literal["torchserve", "litserve"]


class ServerSpec(SpecModel):
    """The server configuration under test: which server, and its batching, workers and precision."""

    kind: ServerKind = Field(default="torchserve", description="Which model server serves the model.")
    batch_size: int = Field(default=1, ge=1, le=4096, description="The largest batch the server forms.")
    max_batch_delay_ms: int = Field(
        default=50,
        ge=1,
        le=60_000,
        description="How long the server waits to fill a batch, in ms (servers ignore values <= 0: 1 is the minimum).",
    )
    workers: int = Field(default=1, ge=1, le=64, description="Backend worker processes (model copies).")
    precision: Precision = Precision.FP32
    gpus: int = Field(default=1, ge=0, le=16, description="GPUs requested on Kubernetes (0 = CPU).")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    image: str | None = Field(default=None, description="The server's container image; unset: the server's pinned one.")
    job_queue_size: int = Field(default=1000, ge=1, le=100_000)
    response_timeout_seconds: int = Field(default=300, ge=1, le=3600)
    startup_timeout_seconds: int = Field(default=600, ge=1, le=7200)
    warmup_seconds: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="Time budget of each worker's warm-up before it serves: the batch sizes the load can form "
        "(powers of two) run once each, smallest first, until the next would overrun it. 0 = no warm-up.",
    )

    @field_validator("image")
    @classmethod
    def _pinned_image(cls, value: str | None) -> str | None:
        if value is None:
            return value
        last = value.rsplit("/", 1)[-1]
        if "@" not in last and ":" not in last:
            raise ValueError(f"'{value}' has no tag; pin a version (e.g. {value}:1.0)")
        if last.endswith(":latest"):
            raise ValueError(f"'{value}' uses the moving tag 'latest'; pin a version")
        return value
