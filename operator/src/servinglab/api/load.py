"""The load an experiment sends: closed-loop users or open-loop rates, payloads, stability, generators,
traffic shapes. Part of the experiment spec (:mod:`servinglab.api.experiment`), read by the load
generator (:mod:`servinglab.loadgen`) and the measurement driver.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from servinglab.api.kube import Resources
from servinglab.api.meta import SpecModel, VolumePath
from servinglab.api.utilisation import MAX_USERS, UtilisationTargetSpec


class PayloadFormat(StrEnum):
    """Request body the load generator sends: an encoded image or a raw uint8 tensor (.npy)."""

    JPEG = "jpeg"
    PNG = "png"
    RAW = "raw"


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
#: window), well inside what it accepts (servinglab.k8s.sink.MAX_DOCUMENT_BYTES).
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
    utilisation_target: UtilisationTargetSpec | None = Field(
        default=None,
        description="Raise users (closed) or rate (open) until the server's utilisation holds at a target, then "
        "measure there; replaces concurrency and rates.",
    )
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
    resources: Resources | None = Field(
        default=None,
        description="On a cluster: each load pod's CPU/memory requests and limits; unset: the operator's "
        "(its loadJob.resources setting).",
    )

    def describe(self) -> str:
        """One line for people: what load is about to run."""
        if self.shape is not None:
            return f"{self.mode} loop, {self.shape.kind} shape"
        if (aim := self.utilisation_target) is not None:
            raised = "users" if self.mode == "closed" else "rate"
            return (f"{self.mode} loop, {raised} raised until the {aim.resource} utilisation holds at "
                    f"{aim.target:g} ± {aim.tolerance:g}")  # fmt: skip
        if self.mode == "closed":
            return f"closed loop, concurrency {self.concurrency}"
        parts = [f"open loop ({self.arrival}), rates {self.rates} rps" if self.rates else f"open loop ({self.arrival})"]
        if self.rate_search is not None:
            parts.append(f"peak-rate search {self.rate_search.min_rps:g}..{self.rate_search.max_rps:g} rps")
        return ", ".join(parts)

    @model_validator(mode="after")
    def _open_loop_has_rates(self) -> LoadSpec:
        aim = self.utilisation_target
        if self.mode == "open" and not self.rates and self.rate_search is None and self.shape is None and aim is None:
            raise ValueError("mode open needs rates, rateSearch, shape or utilisationTarget")
        closed_step = self.shape is not None and self.shape.step is not None and self.shape.step.users is not None
        if self.mode == "closed" and (self.rates or self.rate_search is not None):
            raise ValueError("rates and rateSearch need mode: open")
        if self.shape is not None and (self.mode == "closed") != closed_step:
            raise ValueError("shape: step.users needs mode: closed; step.rates, burst and trace need mode: open")
        if self.shape is not None and (self.rates or self.rate_search is not None):
            raise ValueError("shape replaces rates and rateSearch: give one or the other")
        if self.shape is not None and self.repeats > 1:
            raise ValueError(f"repeats: {self.repeats}; a shaped run is one run (its phases are its levels)")
        if aim is not None:
            self._check_utilisation_target(aim)
        return self

    def _check_utilisation_target(self, aim: UtilisationTargetSpec) -> None:
        """The utilisation search chooses the levels itself: nothing else may name them. A value equal to its
        default is not a choice: a validated spec is kept with its defaults filled in (the operator's snapshot,
        the load Job's copy) and must read back the same."""
        fields = type(self).model_fields
        given = [name for name, field in (("concurrency", "concurrency"), ("rates", "rates"),
                 ("rateSearch", "rate_search"), ("shape", "shape"))
                 if field in self.model_fields_set
                 and getattr(self, field) != fields[field].get_default(call_default_factory=True)]  # fmt: skip
        if given:
            raise ValueError(f"utilisationTarget chooses the load itself; remove {', '.join(given)}")
        if self.repeats > 1:
            raise ValueError(f"repeats: {self.repeats}; the utilisation search probes each load once")
        if self.mode == "open" and aim.start is None:
            raise ValueError("utilisationTarget.start: an open loop needs the first probe's rate (rps)")
        if self.mode == "closed":
            for name, users in (("start", aim.start), ("maxLoad", aim.max_load)):
                if users is not None and (users != int(users) or users > MAX_USERS):
                    raise ValueError(
                        f"utilisationTarget.{name}: {users:g} users; a closed loop needs a whole number, 1..{MAX_USERS}"
                    )
        probe, full = aim.probe_seconds, max(self.duration_seconds, self.stability.max_duration_seconds or 0.0)
        if probe is not None and probe > full:
            raise ValueError(f"utilisationTarget.probeSeconds: {probe:g} is longer than durationSeconds {full:g}")

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
        if self.utilisation_target is not None:  # the probes, then the measurement at the load found
            levels = self.utilisation_target.max_probes + 1
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
