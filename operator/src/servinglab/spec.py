"""The ServingExperiment v1alpha1 spec: the one validated model of what a user asks for.

Everything else derives from it: the local runner (`servinglab run`), the TorchServe configuration
renderer, the load generator's settings and (later) the CRD schema and the operator. Parsing goes
through :func:`load_experiment` / :func:`parse_experiment`, which turn pydantic's errors into
:class:`SpecError` with one message per problem, each naming the field path and the bad value.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

API_GROUP = "servinglab.dev"
API_VERSION = "v1alpha1"
KIND = "ServingExperiment"

#: Built-in demo models shipped in model-store/ (see :mod:`servinglab.models`).
BUILTIN_MODELS = ("resnet50", "tiny")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


class SpecModel(BaseModel):
    """Base: camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Precision(StrEnum):
    """Numeric precision the handler runs the model in.

    fp32 is strict IEEE fp32 (TF32 explicitly off); tf32 allows TF32 matmuls/convolutions on GPUs
    that have them; fp16 and bf16 convert weights and inputs to that type (not autocast).
    """

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"


class PayloadFormat(StrEnum):
    """Request body the load generator sends: an encoded image or a raw uint8 tensor (.npy)."""

    JPEG = "jpeg"
    PNG = "png"
    RAW = "raw"


class ModelFormat(StrEnum):
    """What a model source holds. `auto` decides from the file name, then from the content."""

    AUTO = "auto"
    MAR = "mar"  # a TorchServe archive (.mar), served with its own handler
    DIRECTORY = "directory"  # a TorchServe no-archive directory (MAR-INF/MANIFEST.json inside)
    TORCHSCRIPT = "torchscript"  # torch.jit.save output, packed with servinglab's handler
    EXPORTED = "exported"  # torch.export.save output (.pt2), packed with servinglab's handler


class SecretKeyRef(SpecModel):
    """One key of a Secret in the experiment's namespace."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]


def _relative_path(value: str) -> str:
    if value.startswith("/") or ".." in value.split("/"):
        raise ValueError(f"'{value}' must be a relative path inside the volume (no leading '/', no '..')")
    return value


class VolumePath(SpecModel):
    """A file or folder on a PersistentVolumeClaim of the experiment's namespace, mounted read-only."""

    claim_name: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
    path: Annotated[str, Field(min_length=1, max_length=1024)]

    @field_validator("path")
    @classmethod
    def _inside(cls, value: str) -> str:
        return _relative_path(value)


class ModelSource(SpecModel):
    """Where a model that is not built in comes from: exactly one of url, path and pvc."""

    url: str | None = Field(default=None, description="http(s) URL of the model file, archive or tarless folder.")
    path: str | None = Field(default=None, description="Local runs only: a file or no-archive folder on this machine.")
    pvc: VolumePath | None = Field(default=None, description="Kubernetes only: a file or folder on a claim.")
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Expected sha256 of the file (lowercase hex), checked before serving; unset: recorded only.",
    )
    format: ModelFormat = ModelFormat.AUTO
    authorization_secret: SecretKeyRef | None = Field(
        default=None,
        description="url only: a Secret key whose value is sent as the Authorization header "
        "(mounted only into the fetching init container).",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        given = [name for name in ("url", "path", "pvc") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"set exactly one of url, path, pvc (got {', '.join(given) or 'none'})")
        if self.url is not None and not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"url: '{self.url}' is not an http(s) URL")
        if self.authorization_secret is not None and self.url is None:
            raise ValueError("authorizationSecret: only a url source sends credentials")
        if self.sha256 is not None and self.format is ModelFormat.DIRECTORY:
            raise ValueError("sha256: a folder has no single digest; give it for a file (.mar, .pt, .pt2)")
        return self

    def describe(self) -> str:
        if self.url is not None:
            return self.url
        if self.pvc is not None:
            return f"pvc://{self.pvc.claim_name}/{self.pvc.path}"
        return str(self.path)


class ModelInput(SpecModel):
    """What one request decodes to for a model packed with servinglab's handler (TorchScript, .pt2)."""

    kind: Literal["image", "tensor"] = Field(
        default="image",
        description="image: an encoded image, decoded and resized to size x size RGB; "
        "tensor: a .npy array or JSON list of `shape`, cast to `dtype`.",
    )
    size: int = Field(default=224, ge=8, le=4096, description="image: the side length the model takes.")
    shape: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=list, max_length=6, description="tensor: the shape of one sample (no batch dimension)."
    )
    dtype: Literal["float32", "float16", "bfloat16", "int64", "int32", "uint8"] = Field(
        default="float32", description="tensor: the element type the model takes at fp32 (floats follow precision)."
    )

    @model_validator(mode="after")
    def _tensor_has_shape(self) -> ModelInput:
        if self.kind == "tensor" and not self.shape:
            raise ValueError("kind tensor needs shape (one sample's dimensions, e.g. [16])")
        if self.kind == "image" and self.shape:
            raise ValueError("shape is for kind tensor; an image input takes size")
        return self


class ModelRef(SpecModel):
    """Which model to serve: a built-in demo model, or the user's own from a source."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")]
    source: ModelSource | None = Field(default=None, description="Unset: `name` must be a built-in model.")
    input: ModelInput | None = Field(
        default=None, description="TorchScript and exported programs: what a request decodes to. Default: image 224."
    )

    @model_validator(mode="before")
    @classmethod
    def _archive_was_renamed(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "archive" in data:
            raise ValueError(
                f"archive: replaced by source (url, path or pvc); write source: {{path: {data['archive']!r}}} "
                f"or source: {{url: ...}}"
            )
        return data

    @model_validator(mode="after")
    def _builtin_or_source(self) -> ModelRef:
        if self.source is None and self.name not in BUILTIN_MODELS:
            raise ValueError(
                f"'{self.name}' is not a built-in model ({', '.join(BUILTIN_MODELS)}); "
                "set model.source to serve your own"
            )
        if self.source is None and self.input is not None:
            raise ValueError("input: built-in models declare their own input; it is for a model.source")
        if self.source is not None and self.source.format in (ModelFormat.MAR, ModelFormat.DIRECTORY) and self.input:
            raise ValueError("input: an archive's own handler decodes requests; input is for TorchScript and .pt2")
        return self


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


DEFAULT_SERVER_IMAGE = "pytorch/torchserve:0.12.0-gpu"


class ServerSpec(SpecModel):
    """The TorchServe configuration under test."""

    batch_size: int = Field(default=1, ge=1, le=4096, description="TorchServe batchSize.")
    max_batch_delay_ms: int = Field(
        default=50,
        ge=1,
        le=60_000,
        description="TorchServe maxBatchDelay in ms; TorchServe ignores values <= 0, so 1 is the minimum.",
    )
    workers: int = Field(default=1, ge=1, le=64, description="Backend worker processes (model copies).")
    precision: Precision = Precision.FP32
    gpus: int = Field(default=1, ge=0, le=16, description="GPUs requested on Kubernetes (0 = CPU).")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    image: str = DEFAULT_SERVER_IMAGE
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
    def _pinned_image(cls, value: str) -> str:
        last = value.rsplit("/", 1)[-1]
        if "@" not in last and ":" not in last:
            raise ValueError(f"'{value}' has no tag; pin a version (e.g. {DEFAULT_SERVER_IMAGE})")
        if last.endswith(":latest"):
            raise ValueError(f"'{value}' uses the moving tag 'latest'; pin a version")
        return value


class ResponseCheck(SpecModel):
    """What a good answer looks like beyond a 2xx status; a failed check counts as an error of its kind."""

    status: int = Field(default=200, ge=100, le=599, description="The status every answer must have.")
    json_body: bool = Field(
        default=False, alias="json", description="The body must parse as JSON (errors: `malformed_json`)."
    )


def _in_payload_folder(value: str) -> str:
    """A payload or trace file: named inside the payload folder (the load also refuses symlinks out)."""
    if value.startswith("/") or ".." in value.split("/"):
        raise ValueError(f"'{value}' must be a relative path inside the payload folder (no leading '/', no '..')")
    return value


class PayloadSpec(SpecModel):
    """What each request carries: generated images (the default), or the user's own bodies.

    Own bodies are `files` (each sent whole; content type from the extension) or `records`, a
    JSON-lines file of `{"body": <JSON or text>, "contentType": ...}` or `{"bodyFile": <path>,
    "contentType": ...}` records; they are sent in an order shuffled by `seed`. Locally, paths are
    relative to the current directory; on Kubernetes, to the `configMap` or `pvc` folder they are
    mounted from (a ConfigMap's keys are its file names)."""

    format: PayloadFormat = PayloadFormat.JPEG
    image_size: int | None = Field(default=None, ge=8, le=4096)
    variants: int = Field(default=8, ge=1, le=256, description="Distinct generated images, sent in turn.")
    seed: int = Field(default=0, ge=0)
    files: list[Annotated[str, Field(min_length=1, max_length=1024)]] = Field(
        default_factory=list, max_length=10_000, description="Request bodies, one file each."
    )
    records: str | None = Field(default=None, min_length=1, max_length=1024, description="A JSON-lines file of bodies.")
    config_map: str | None = Field(
        default=None, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", description="Kubernetes: where files/records live."
    )
    pvc: VolumePath | None = Field(default=None, description="Kubernetes: the folder on a claim files/records are in.")
    check: ResponseCheck | None = None

    @property
    def own_bodies(self) -> bool:
        return bool(self.files) or self.records is not None

    @model_validator(mode="after")
    def _one_kind_of_body(self) -> PayloadSpec:
        if self.files and self.records is not None:
            raise ValueError("files and records: give one of them")
        if self.config_map is not None and self.pvc is not None:
            raise ValueError("configMap and pvc: the bodies come from one of them")
        if (self.config_map is not None or self.pvc is not None) and not self.own_bodies:
            raise ValueError("configMap/pvc: name the bodies in files or records")
        for name in [*self.files, *([self.records] if self.records else [])]:
            if self.config_map is not None and "/" in name:
                raise ValueError(f"'{name}': a ConfigMap holds flat file names (its keys), no '/'")
            _in_payload_folder(name)
        return self


#: Shortest stability window: a shorter one holds a handful of requests, judges nothing and only
#: inflates the results document (every window is one record of it).
MIN_WINDOW_SECONDS = 0.05
#: Most stability windows one level, and one experiment in all, may be cut into. The operator reads the
#: results document whole; these keep the largest legal one about 3.5 MB of JSON (some 60 bytes a
#: window), well inside what it accepts (servinglab.loadgen.results_sink.MAX_DOCUMENT_BYTES).
MAX_WINDOWS_PER_LEVEL = 10_000
MAX_WINDOWS = 50_000
#: Most phases a burst run may have (each phase carries its own figures in the results).
MAX_PHASES = 2_000


class StabilitySpec(SpecModel):
    """When a level's numbers have settled: its last `windows` windows agree within `tolerance`."""

    window_seconds: float = Field(
        default=5.0, ge=MIN_WINDOW_SECONDS, le=600, description="Length of one measurement window."
    )
    windows: int = Field(default=3, ge=2, le=20, description="How many trailing windows must agree.")
    tolerance: float = Field(
        default=0.10, gt=0, le=1, description="Largest (max - min) / mean of throughput and of p99 across them."
    )
    max_duration_seconds: float | None = Field(
        default=None,
        gt=0,
        le=7200,
        description="Extend an unstable level's measurement up to this long; unset: never extend.",
    )


class GeneratorLimits(SpecModel):
    """When the load generator, not the server, is the limit: its results are flagged."""

    max_cpu_percent: float = Field(
        default=85.0, gt=0, le=100, description="Generator CPU (of its one core) above which it limited the load."
    )
    max_send_gap_ms: float = Field(
        default=10.0, gt=0, le=10_000, description="p99 send delay (ms) above which the generator may have limited."
    )
    max_send_gap_share: float = Field(
        default=0.10, gt=0, le=1, description="...and only when that p99 delay is this share of the p99 latency."
    )


class RateSearchSpec(SpecModel):
    """Find the highest open-loop rate whose p99 meets `slo.p99LatencyMs` (bisection between two rates)."""

    min_rps: float = Field(gt=0, le=1_000_000, description="Lowest rate tried; expected to meet the SLO.")
    max_rps: float = Field(gt=0, le=1_000_000, description="Highest rate tried.")
    precision: float = Field(default=0.05, gt=0, le=1, description="Stop when the bracket is this narrow (relative).")
    max_probes: int = Field(default=8, ge=2, le=32, description="At most this many probe levels.")

    @model_validator(mode="after")
    def _ordered(self) -> RateSearchSpec:
        if self.min_rps >= self.max_rps:
            raise ValueError(f"rateSearch.minRps {self.min_rps:g} must be below maxRps {self.max_rps:g}")
        return self


class StepShape(SpecModel):
    """A staircase in one run, each step held `stepSeconds`: open-loop `rates`, or closed-loop `users`."""

    rates: list[Annotated[float, Field(gt=0, le=1_000_000)]] | None = Field(default=None, min_length=2, max_length=64)
    users: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(default=None, min_length=2, max_length=64)
    step_seconds: float = Field(gt=0, le=3600, description="How long each step is held.")

    @model_validator(mode="after")
    def _rates_or_users(self) -> StepShape:
        if (self.rates is None) == (self.users is None):
            raise ValueError("step needs rates (open loop) or users (closed loop), not both")
        return self


class BurstShape(SpecModel):
    """A base rate with a burst of `burstRps` for `burstSeconds` at the end of every `periodSeconds`."""

    base_rps: float = Field(gt=0, le=1_000_000)
    burst_rps: float = Field(gt=0, le=1_000_000)
    burst_seconds: float = Field(gt=0, le=3600)
    period_seconds: float = Field(gt=0, le=3600)
    duration_seconds: float = Field(gt=0, le=7200, description="The whole measured run.")

    @model_validator(mode="after")
    def _burst_fits(self) -> BurstShape:
        if self.burst_seconds >= self.period_seconds:
            raise ValueError(
                f"burst.burstSeconds {self.burst_seconds:g} must be shorter than periodSeconds {self.period_seconds:g}"
            )
        if self.burst_rps <= self.base_rps:
            raise ValueError(f"burst.burstRps {self.burst_rps:g} must be above baseRps {self.base_rps:g}")
        return self


class TraceShape(SpecModel):
    """Replay of recorded send times: a text file, one request per line, `<seconds>[,<payload index>]`
    (the first time is the start; '#' lines are comments), relative to the payload files' folder."""

    file: str = Field(
        min_length=1,
        max_length=1024,
        description="The trace file, relative to the payload folder (locally the current directory; on a "
        "cluster payload's configMap/pvc).",
    )
    speed: float = Field(default=1.0, gt=0, le=1000, description="Replay this many times faster (2: half the gaps).")

    @field_validator("file")
    @classmethod
    def _inside(cls, value: str) -> str:
        return _in_payload_folder(value)


class ShapeSpec(SpecModel):
    """An open-loop run whose rate changes over time; exactly one of step, burst or trace. Latency
    counts from each request's scheduled send; results carry per-phase figures and the time series."""

    step: StepShape | None = None
    burst: BurstShape | None = None
    trace: TraceShape | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ShapeSpec:
        given = [name for name in ("step", "burst", "trace") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"shape needs exactly one of step, burst or trace (given: {', '.join(given) or 'none'})")
        return self

    @property
    def kind(self) -> str:
        return "step" if self.step is not None else "burst" if self.burst is not None else "trace"


#: Most load-generator processes (or pods) one level may be split between.
MAX_GENERATORS = 64


class LoadSpec(SpecModel):
    """The load test: closed-loop concurrency levels or open-loop rates, each warmed up then measured."""

    mode: Literal["closed", "open"] = Field(
        default="closed",
        description="closed: N users send back to back (concurrency); open: requests at scheduled rates (rates).",
    )
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1, 4, 16], min_length=1, max_length=64
    )
    rates: list[Annotated[float, Field(gt=0, le=1_000_000)]] = Field(
        default_factory=list, max_length=64, description="Open loop: requests per second, one level each."
    )
    arrival: Literal["poisson", "constant"] = Field(
        default="poisson", description="Open loop: Poisson arrivals (exponential gaps) or evenly spaced sends."
    )
    max_in_flight: int = Field(
        default=1024, ge=1, le=65536, description="Open loop: sends beyond this many outstanding are dropped."
    )
    rate_search: RateSearchSpec | None = None
    shape: ShapeSpec | None = Field(
        default=None, description="Open loop: one run whose rate changes (step, burst or trace replay)."
    )
    repeats: int = Field(
        default=1, ge=1, le=20, description="Run each level this many times; > 1 adds a 95% confidence interval."
    )
    warmup_seconds: float = Field(default=10.0, ge=0, le=3600, description="Per level, excluded.")
    duration_seconds: float = Field(default=60.0, gt=0, le=3600, description="Measured time per level.")
    request_timeout_seconds: float = Field(default=60.0, gt=0, le=600)
    payload: PayloadSpec = Field(default_factory=PayloadSpec)
    stability: StabilitySpec = Field(default_factory=StabilitySpec)
    generator: GeneratorLimits = Field(default_factory=GeneratorLimits)
    generators: Annotated[int, Field(ge=1, le=MAX_GENERATORS)] | Literal["auto"] = Field(
        default=1,
        description="Load-generator processes sharing each level (users or rate split between them), results "
        "merged exactly; auto: one per core. On a cluster: that many load pods.",
    )

    def describe(self) -> str:
        """One line for people: what load is about to run."""
        if self.shape is not None:
            return f"{self.mode} loop, {self.shape.kind} shape"
        if self.mode == "closed":
            return f"closed loop, concurrency {self.concurrency}"
        parts = [f"open loop ({self.arrival}), rates {self.rates} rps" if self.rates else f"open loop ({self.arrival})"]
        if self.rate_search is not None:
            parts.append(f"peak-rate search {self.rate_search.min_rps:g}..{self.rate_search.max_rps:g} rps")
        return ", ".join(parts)

    @model_validator(mode="after")
    def _open_loop_has_rates(self) -> LoadSpec:
        if self.mode == "open" and not self.rates and self.rate_search is None and self.shape is None:
            raise ValueError("mode open needs rates, rateSearch or shape")
        closed_step = self.shape is not None and self.shape.step is not None and self.shape.step.users is not None
        if self.mode == "closed" and (self.rates or self.rate_search is not None):
            raise ValueError("rates and rateSearch need mode: open")
        if self.shape is not None and (self.mode == "closed") != closed_step:
            raise ValueError("shape: step.users needs mode: closed; step.rates, burst and trace need mode: open")
        if self.shape is not None and (self.rates or self.rate_search is not None):
            raise ValueError("shape replaces rates and rateSearch: give one or the other")
        if self.shape is not None and self.repeats > 1:
            raise ValueError(f"repeats: {self.repeats}; a shaped run is one run (its phases are its levels)")
        return self

    @model_validator(mode="after")
    def _results_stay_bounded(self) -> LoadSpec:
        """Every window and phase is a record of the results the operator reads whole: cap them (a
        trace's length is only known from its file: the load checks it on reading)."""
        window = self.stability.window_seconds
        levels, longest = self._levels_and_longest()
        per_level = math.floor(longest / window + 1e-6)  # as loadgen.stats.windows counts them
        if per_level > MAX_WINDOWS_PER_LEVEL:
            raise ValueError(
                f"stability.windowSeconds: {window:g} s windows over a level measured up to {longest:g} s are "
                f"{per_level} windows; at most {MAX_WINDOWS_PER_LEVEL} per level "
                f"(windowSeconds >= {longest / MAX_WINDOWS_PER_LEVEL:.3g})"
            )
        if per_level * levels > MAX_WINDOWS:
            raise ValueError(
                f"stability.windowSeconds: {window:g} s windows over {levels} levels of up to {longest:g} s are "
                f"{per_level * levels} windows; at most {MAX_WINDOWS} in all "
                f"(windowSeconds >= {longest * levels / MAX_WINDOWS:.3g}, or fewer levels)"
            )
        burst = self.shape.burst if self.shape is not None else None
        if burst is not None and (phases := 2 * math.ceil(burst.duration_seconds / burst.period_seconds)) > MAX_PHASES:
            raise ValueError(
                f"shape.burst.periodSeconds: {burst.period_seconds:g} s periods over {burst.duration_seconds:g} s "
                f"are up to {phases} phases; at most {MAX_PHASES} "
                f"(periodSeconds >= {2 * burst.duration_seconds / MAX_PHASES:.3g})"
            )
        return self

    def _levels_and_longest(self) -> tuple[int, float]:
        """How many levels the load runs (a shaped run is one) and the longest any is measured."""
        if self.shape is not None and self.shape.step is not None:
            steps = self.shape.step.rates or self.shape.step.users or []
            return 1, len(steps) * self.shape.step.step_seconds
        if self.shape is not None:
            return 1, self.shape.burst.duration_seconds if self.shape.burst is not None else 0.0
        levels = len(self.concurrency) if self.mode == "closed" else len(self.rates)
        if self.mode == "open" and self.rate_search is not None:
            levels += self.rate_search.max_probes
        return levels, max(self.duration_seconds, self.stability.max_duration_seconds or 0.0)

    @model_validator(mode="after")
    def _extension_is_longer(self) -> LoadSpec:
        limit = self.stability.max_duration_seconds
        if limit is not None and limit < self.duration_seconds:
            raise ValueError(
                f"stability.maxDurationSeconds: {limit:g} is shorter than durationSeconds {self.duration_seconds:g}"
            )
        return self

    @field_validator("concurrency")
    @classmethod
    def _unique_levels(cls, value: list[int]) -> list[int]:
        seen: set[int] = set()
        for level in value:
            if level in seen:
                raise ValueError(f"level {level} appears twice")
            seen.add(level)
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
        default=True, description="Delete the TorchServe Deployment and Service after the run (results stay)."
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


class ObjectMeta(SpecModel):
    """The part of Kubernetes metadata an experiment file may carry."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=52)]
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        # 52 leaves room for child-name suffixes within Kubernetes' 63-character label limit.
        if not _DNS_LABEL.match(value):
            raise ValueError(
                f"'{value}' is not a DNS-1123 label (lowercase letters, digits and '-', "
                "starting and ending with a letter or digit)"
            )
        return value


class ServingExperiment(SpecModel):
    """A whole experiment document, as applied with kubectl or run with `servinglab run`."""

    api_version: Literal["servinglab.dev/v1alpha1"]
    kind: Literal["ServingExperiment"]
    metadata: ObjectMeta
    spec: ExperimentSpec


class SpecError(ValueError):
    """An experiment failed validation; `problems` holds one 'field.path: message' per error."""

    def __init__(self, problems: list[str], source: str | None = None, what: str = "experiment") -> None:
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + f"invalid {what}:\n  " + "\n  ".join(problems))


def field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + str(part)
    return path or "(document)"


def describe_error(error: Mapping[str, Any]) -> str:
    """One human sentence for a pydantic error, always quoting the offending value."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    shown = repr(value) if isinstance(value, str) else str(value)
    if kind in ("greater_than_equal", "greater_than"):
        bound = ctx.get("ge", ctx.get("gt"))
        word = "the minimum" if kind == "greater_than_equal" else "the exclusive minimum"
        return f"{shown} is below {word} {bound}"
    if kind in ("less_than_equal", "less_than"):
        bound = ctx.get("le", ctx.get("lt"))
        word = "the maximum" if kind == "less_than_equal" else "the exclusive maximum"
        return f"{shown} is above {word} {bound}"
    if kind == "extra_forbidden":
        return f"unknown field (value {shown})"
    if kind == "missing":
        return "required field is missing"
    if kind in ("literal_error", "enum"):
        return f"{shown} is not one of {ctx.get('expected')}"
    if kind in ("too_short", "too_long"):
        return f"{shown} has {ctx.get('actual_length')} items; {error['msg'].lower()}"
    if kind == "string_pattern_mismatch":
        return f"{shown} does not match the pattern {ctx.get('pattern')}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return f"{shown}: {error['msg']}"


def as_json(document: Any) -> str:
    """The document as the API server would see it: JSON, where YAML's dates and the like are strings.

    Specs are validated from this text in pydantic's strict mode, so a value the CRD schema refuses
    (`true` or "8" where an integer is expected, 1.5 for an integer) is refused here too, instead of
    being coerced; only an integer where a number is expected is taken, as JSON Schema does."""
    return json.dumps(document, default=str)


def parse_experiment(document: Any, source: str | None = None) -> ServingExperiment:
    """Validate one parsed YAML/JSON document; raise :class:`SpecError` naming every bad field."""
    if not isinstance(document, Mapping):
        raise SpecError([f"(document): expected a mapping, got {type(document).__name__}"], source)
    try:
        return ServingExperiment.model_validate_json(as_json(document), strict=True)
    except ValidationError as exc:
        problems = [f"{field_path(e['loc'])}: {describe_error(e)}" for e in exc.errors()]
        raise SpecError(problems, source) from None


def read_document(path: str | Path, what: str = "experiment") -> Any:
    """The one YAML or JSON document of a file; :class:`SpecError` when unreadable or not exactly one."""
    path = Path(path)
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except OSError as exc:
        raise SpecError([f"cannot read file: {exc.strerror}"], str(path), what) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"not valid YAML: {exc}"], str(path), what) from None
    if len(documents) != 1:
        raise SpecError([f"expected exactly one document, found {len(documents)}"], str(path), what)
    return documents[0]


def load_experiment(path: str | Path) -> ServingExperiment:
    """Read and validate an experiment file (YAML or JSON, exactly one document)."""
    return parse_experiment(read_document(path), str(path))
