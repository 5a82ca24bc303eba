"""The ServingExperiment v1alpha1 spec: the one validated model of what a user asks for.

Everything else derives from it: the local runner (`servinglab run`), the servers' configuration
renderers, the load generator's settings, the CRD schema and the operator. Parsing goes through
:func:`parse_experiment` / :func:`load_experiment`, which name every bad field and value.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from servinglab.api.load import LoadSpec
from servinglab.api.meta import ObjectMeta, SpecModel, parse_document, read_document
from servinglab.api.modelref import ModelRef

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
ServerKind = Literal["torchserve"]


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


class SloSpec(SpecModel):
    """Optional latency objective; levels that meet it are marked and the best one picked."""

    p99_latency_ms: float | None = Field(default=None, gt=0, le=3_600_000)


class MetricsSpec(SpecModel):
    """Where GPU (DCGM) metrics are read from on Kubernetes."""

    prometheus_url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")


class CleanupSpec(SpecModel):
    """What happens to the server under test once the experiment has finished."""

    delete_server: bool = Field(
        default=True, description="Delete the server's Deployment and Service after the run (results stay)."
    )


class CeilingSpec(SpecModel):
    """The references a served result is compared with (FLOPs, raw in-process throughput, peak)."""

    enabled: bool = Field(default=True, description="Measure the model alone after the run (local runs).")
    raw_seconds: float = Field(default=5.0, gt=0, le=600, description="How long the in-process loop runs.")


class ExperimentSpec(SpecModel):
    """`spec` of a ServingExperiment."""

    model: ModelRef
    server: ServerSpec = Field(default_factory=ServerSpec)
    load: LoadSpec = Field(default_factory=LoadSpec)
    slo: SloSpec = Field(default_factory=SloSpec)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    cleanup: CleanupSpec = Field(default_factory=CleanupSpec)
    ceiling: CeilingSpec = Field(default_factory=CeilingSpec)

    @model_validator(mode="after")
    def _search_has_an_objective(self) -> ExperimentSpec:
        if self.load.rate_search is not None and self.slo.p99_latency_ms is None:
            raise ValueError("load.rateSearch needs slo.p99LatencyMs (the latency the peak rate must meet)")
        return self


class ServingExperiment(SpecModel):
    """A whole experiment document, as applied with kubectl or run with `servinglab run`."""

    api_version: Literal["servinglab.dev/v1alpha1"]
    kind: Literal["ServingExperiment"]
    metadata: ObjectMeta
    spec: ExperimentSpec


def parse_experiment(document: Any, source: str | None = None) -> ServingExperiment:
    """Validate one parsed YAML/JSON document; raise :class:`~servinglab.api.meta.SpecError` naming every
    bad field."""
    return parse_document(ServingExperiment, document, source, "experiment")


def load_experiment(path: str | Path) -> ServingExperiment:
    """Read and validate an experiment file (YAML or JSON, exactly one document)."""
    return parse_experiment(read_document(path), str(path))
