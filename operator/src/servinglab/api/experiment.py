"""The ServingExperiment v1alpha1 spec: the one validated model of what a user asks for.

Everything else derives from it: the local runner (`servinglab run`), the servers' configuration
renderers, the load generator's settings, the CRD schema and the operator. Parsing goes through
:func:`parse_experiment` / :func:`load_experiment`, which name every bad field and value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from servinglab.api.cost import CostSpec, with_price
from servinglab.api.datapath import CompileMode
from servinglab.api.forms import ModelForm
from servinglab.api.load import LoadSpec
from servinglab.api.meta import ObjectMeta, SpecModel, parse_document, read_document
from servinglab.api.modelref import EAGER_ONLY_MODELS, ModelRef, redact_url, userinfo_refusal
from servinglab.api.servers import ServerSpec, capabilities


class SloSpec(SpecModel):
    """Optional latency objective; levels that meet it are marked and the best one picked."""

    p99_latency_ms: float | None = Field(default=None, gt=0, le=3_600_000)


#: Where a Prometheus's credentials go: the operator's own settings, sent to the operator's own Prometheus only
#: (never to a URL an experiment names, which could be anyone's).
_PROMETHEUS_CREDENTIALS = (
    "a Prometheus that needs credentials is the operator's: the chart's prometheusUrl with "
    "prometheusAuthorizationSecret (a Secret key the operator sends as the Authorization header)"
)


class MetricsSpec(SpecModel):
    """Where GPU (DCGM) metrics are read from on Kubernetes."""

    prometheus_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s]+$",
        description="The Prometheus to query (no credentials, query string or fragment: the spec is kept in "
        "the experiment's ConfigMap); unset: the operator's.",
    )

    @field_validator("prometheus_url")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if refusal := userinfo_refusal(value, _PROMETHEUS_CREDENTIALS):
            raise ValueError(refusal)
        if redact_url(value) != value:
            raise ValueError(
                f"'{redact_url(value)}' has a query string or fragment, which would be kept in the experiment's "
                "ConfigMap (and the query API is appended to the URL); give the server's base URL; "
                + _PROMETHEUS_CREDENTIALS
            )
        return value


class CleanupSpec(SpecModel):
    """What happens to the server under test once the experiment has finished."""

    delete_server: bool = Field(
        default=True, description="Delete the server's Deployment and Service after the run (results stay)."
    )


class CeilingSpec(SpecModel):
    """The references a served result is compared with (FLOPs, raw in-process throughput, peak)."""

    enabled: bool = Field(default=True, description="Measure the model alone after the run (local runs).")
    raw_seconds: float = Field(default=5.0, gt=0, le=600, description="How long the in-process loop runs.")
    forms: bool = Field(
        default=False,
        description="Also run the model alone in each other form (eager, torchscript, compile, onnxruntime; "
        "tensorrt on a GPU) at the formed batch, each for rawSeconds (local runs of a built-in model): the "
        "report shows the best form alone and what it would gain over the served one.",
    )


class ExperimentSpec(SpecModel):
    """`spec` of a ServingExperiment."""

    model: ModelRef
    server: ServerSpec = Field(default_factory=ServerSpec)
    load: LoadSpec = Field(default_factory=LoadSpec)
    slo: SloSpec = Field(default_factory=SloSpec)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    cleanup: CleanupSpec = Field(default_factory=CleanupSpec)
    ceiling: CeilingSpec = Field(default_factory=CeilingSpec)
    cost: CostSpec | None = Field(
        default=None, description="The price of one server replica per hour: each level's cost per million inferences."
    )

    @model_validator(mode="after")
    def _search_has_an_objective(self) -> ExperimentSpec:
        if self.load.rate_search is not None and self.slo.p99_latency_ms is None:
            raise ValueError("load.rateSearch needs slo.p99LatencyMs (the latency the peak rate must meet)")
        return self

    @model_validator(mode="after")
    def _served_format(self) -> ExperimentSpec:
        if (problem := self.format_problem()) is not None:
            raise ValueError(problem)
        return self

    def format_problem(self) -> str | None:
        """Why the server does not serve the user's model in its declared format (naming the fields), or None."""
        source = self.model.source
        if source is None:
            return None
        return capabilities(self.server.kind).format_problem(self.server.kind, source.format)

    @model_validator(mode="after")
    def _eager_only_model(self) -> ExperimentSpec:
        why = EAGER_ONLY_MODELS.get(self.model.name) if self.model.source is None else None
        if why is None:
            return self
        if self.server.form not in (None, ModelForm.EAGER):
            raise ValueError(f"server.form: {self.server.form}; model {self.model.name} runs eager only: {why}")
        if self.server.data_path.compile is not CompileMode.NONE:
            raise ValueError(f"server.dataPath.compile: {self.server.data_path.compile}; model {self.model.name} "
                             f"runs eager only: {why}")  # fmt: skip
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


def load_experiment(path: str | Path, price_per_hour: float | None = None) -> ServingExperiment:
    """Read and validate an experiment file (YAML or JSON, exactly one document); a `price_per_hour`
    overrides its `cost`."""
    return parse_experiment(with_price(read_document(path), price_per_hour), str(path))
