"""The ServingExperiment and ServingSweep CustomResourceDefinitions, generated from the API models (pure).

The spec and the status models are the single source of truth: their pydantic JSON schemas are turned
into the structural OpenAPI v3.0 schemas Kubernetes requires — references inlined, `Optional[X]` as
nullable X, numeric `exclusiveMinimum` as OpenAPI's boolean form, titles dropped,
`additionalProperties: false` dropped (the API server prunes unknown fields instead, and kubectl's strict
validation reports them), and no defaults in a status. Checks that need code (a built-in model or an
archive, unique levels) stay in the operator.

Used by `servinglab crd` and the Helm chart (a test keeps the chart's copy in sync).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from servinglab.api.experiment import ExperimentSpec
from servinglab.api.meta import API_GROUP, API_VERSION, KIND, PLURAL, SWEEP_KIND, SWEEP_PLURAL
from servinglab.api.status import ExperimentStatus, SweepStatus
from servinglab.api.sweep import SweepSpec

SHORT_NAMES = ["sx"]
SWEEP_SHORT_NAMES = ["ssw"]

#: An OpenAPI schema, or a manifest built from them: JSON for the API server.
Schema = dict[str, Any]

_DROPPED_KEYS = {"title", "$defs"}


def _kept_keywords(schema: Schema) -> list[tuple[str, Any]]:
    """The keywords a structural schema keeps, a one-member Literal's `const` as a one-value `enum`
    (the API server's schemas have no const); titles, definitions, `additionalProperties: false` and
    null defaults go."""
    kept = []
    for key, value in schema.items():
        if key in _DROPPED_KEYS or (key == "additionalProperties" and value is False):
            continue
        if key == "default" and value is None:
            continue
        kept.append(("enum", [value]) if key == "const" else (key, value))
    return kept


def _structural(schema: Schema, definitions: Schema) -> Schema:
    if "$ref" in schema:
        target = definitions[schema["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _structural(merged, definitions)
    variants = schema.get("anyOf")
    if variants is not None and {v.get("type") for v in variants} == {"integer", "string"}:
        # a count or a keyword (e.g. generators: 4 | auto); the operator's parse checks the rest
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "title")}
        return {**rest, "x-kubernetes-int-or-string": True}
    if variants is not None:
        non_null = [v for v in variants if v.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"cannot express anyOf {variants} structurally")
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        merged = {**_structural(non_null[0], definitions), **rest, "nullable": True}
        return _structural(merged, definitions)
    result: Schema = {}
    for key, value in _kept_keywords(schema):
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            result["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            result[key] = True
        elif key == "properties":
            result[key] = {name: _structural(sub, definitions) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            result[key] = _structural(value, definitions)
        else:
            result[key] = value
    return result


IMMUTABLE_SPEC_MESSAGE = "spec is immutable once applied: delete the experiment and apply a new one"


def _without_defaults(schema: Any) -> Any:
    """A status schema must not default anything: the API server would add the defaults to what is stored,
    and the status read back would differ from the status written."""
    if isinstance(schema, dict):
        return {key: _without_defaults(value) for key, value in schema.items() if key != "default"}
    if isinstance(schema, list):
        return [_without_defaults(item) for item in schema]
    return schema


def status_schema(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI schema of `status`, generated from the typed status model: the API server
    stores exactly the fields servinglab writes (an unknown one would be pruned, a wrong type refused)."""
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    return dict(_without_defaults(_structural(raw, raw.get("$defs", {}))))


def spec_schema(model: type[BaseModel] = ExperimentSpec) -> Schema:
    """The structural OpenAPI schema of `spec`; the API server refuses edits of an applied spec,
    so results always describe the spec that is stored with them."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema = _structural(raw, raw.get("$defs", {}))
    schema["x-kubernetes-validations"] = [{"rule": "self == oldSelf", "message": IMMUTABLE_SPEC_MESSAGE}]
    return schema


def _column(name: str, json_path: str, kind: str = "string", priority: int = 0) -> Schema:
    column: Schema = {"name": name, "type": kind, "jsonPath": json_path}
    if priority:
        column["priority"] = priority
    return column


def _manifest(
    kind: str,
    plural: str,
    short_names: list[str],
    spec: Schema,
    status: Schema,
    columns: list[Schema],
    about: str,
) -> Schema:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": about,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_manifest() -> Schema:
    """The ServingExperiment CustomResourceDefinition."""
    columns = [
        _column("Model", ".spec.model.name"),
        _column("Server", ".spec.server.kind"),
        _column("Batch", ".spec.server.batchSize", "integer"),
        _column("Delay", ".spec.server.maxBatchDelayMs", "integer"),
        _column("Workers", ".spec.server.workers", "integer"),
        _column("Precision", ".spec.server.precision"),
        _column("RPS", ".status.summary.bestThroughputRps", "number"),
        _column("P99", ".status.summary.bestP99LatencyMs", "number"),
        _column("State", ".status.summary.state"),
        _column("Verdict", ".status.summary.verdict", priority=1),
        _column("Age", ".metadata.creationTimestamp", "date"),
    ]
    return _manifest(
        KIND, PLURAL, SHORT_NAMES, spec_schema(), status_schema(ExperimentStatus), columns,
        "A model server configuration benchmarked under load.",
    )  # fmt: skip


def sweep_crd_manifest() -> Schema:
    """The ServingSweep CustomResourceDefinition."""
    columns = [
        _column("Model", ".spec.template.model.name"),
        _column("Strategy", ".spec.strategy"),
        _column("Done", ".status.summary.trialsDone", "integer"),
        _column("Running", ".status.summary.trialsRunning", "integer"),
        _column("Total", ".status.summary.trialsTotal", "integer"),
        _column("Best", ".status.summary.bestConfig"),
        _column("RPS", ".status.summary.bestThroughputRps", "number"),
        _column("State", ".status.summary.state"),
        _column("Winner", ".status.summary.winner", priority=1),
        _column("Age", ".metadata.creationTimestamp", "date"),
    ]
    about = "Server configurations of one model searched for the best within an SLO."
    return _manifest(
        SWEEP_KIND, SWEEP_PLURAL, SWEEP_SHORT_NAMES, spec_schema(SweepSpec), status_schema(SweepStatus), columns, about
    )
