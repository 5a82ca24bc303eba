"""The base of every servinglab API object: names, camelCase models, and errors that name the field.

What users write (experiment and sweep specs) are pydantic models built on :class:`SpecModel`, what they
read (results and status) on :class:`ResultModel`. Parsing goes through :func:`parse_document`, which
turns pydantic's errors into :class:`SpecError` with one message per problem, each naming the field path
and the bad value. The API layer is the bottom of the package: nothing here imports the rest of
servinglab.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

API_GROUP = "servinglab.dev"
API_VERSION = "v1alpha1"
#: The `apiVersion` of servinglab's resources: group/version, spelled once.
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"
KIND = "ServingExperiment"
SWEEP_KIND = "ServingSweep"
PLURAL = "servingexperiments"
SWEEP_PLURAL = "servingsweeps"
#: Labels servinglab puts on what it creates: the experiment (by name and by uid) and the sweep.
EXPERIMENT_LABEL = f"{API_GROUP}/experiment"
EXPERIMENT_UID_LABEL = f"{API_GROUP}/experiment-uid"
SWEEP_LABEL = f"{API_GROUP}/sweep"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ResultModel(BaseModel):
    """camelCase on the wire; unknown fields of a newer document are ignored, not refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class SpecModel(BaseModel):
    """Base: camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


def relative_path(value: str) -> str:
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
        return relative_path(value)


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
        # Children are named after it, Services among them (`<name>-server`): API servers that hold Service
        # names to DNS-1035 refuse one that starts with a digit, and so would refuse it mid-run.
        if not value[0].isalpha():
            raise ValueError(f"'{value}' must start with a letter: its Services are named after it (DNS-1035 labels)")
        return value


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


def brief_error(error: Mapping[str, Any]) -> str:
    """'field.path: sentence' for one pydantic error, a long offending value cut short (a peer's 129
    levels or 5,000 characters would drown what is wrong with them)."""
    value = error.get("input")
    if len(shown := repr(value)) > 80:
        value = shown[:60] + f"... ({type(value).__name__})"
    return f"{field_path(error['loc'])}: {describe_error({**error, 'input': value})}"


def as_json(document: Any) -> str:
    """The document as the API server would see it: JSON, where YAML's dates and the like are strings.

    Specs are validated from this text in pydantic's strict mode, so a value the CRD schema refuses
    (`true` or "8" where an integer is expected, 1.5 for an integer) is refused here too, instead of
    being coerced; only an integer where a number is expected is taken, as JSON Schema does."""
    return json.dumps(document, default=str)


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


Document = TypeVar("Document", bound=BaseModel)


def parse_document(
    model: type[Document], document: Any, source: str | None, what: str, problems: list[str] | None = None,
    context: Mapping[str, Any] | None = None,
) -> Document:  # fmt: skip
    """Validate one parsed YAML/JSON document as `model` (strictly, as the API server would: JSON types);
    raise :class:`SpecError` naming every bad field, with `problems` found beforehand. `context` reaches the
    model's validators (what the reader knows beyond the document)."""
    found = list(problems or [])
    if not isinstance(document, Mapping):
        raise SpecError([f"(document): expected a mapping, got {type(document).__name__}"], source, what)
    try:
        parsed = model.model_validate_json(as_json(document), strict=True, context=context)
    except ValidationError as exc:
        found += [f"{field_path(e['loc'])}: {describe_error(e)}" for e in exc.errors()]
        raise SpecError(found, source, what) from None
    if found:
        raise SpecError(found, source, what)
    return parsed
