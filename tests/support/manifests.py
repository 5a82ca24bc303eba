"""ServingExperiment and ServingSweep manifests for the tests: one builder, so each test writes only the spec
it is about, and the header (apiVersion, kind) comes from the package's own constants."""

from __future__ import annotations

import copy
from typing import Any

from servinglab.api import GROUP_VERSION, KIND, SWEEP_KIND

#: The model most tests serve: the built-in tiny one, fast to build and load on a CPU.
TINY = {"name": "tiny"}


def experiment(name: str = "x", /, **spec: Any) -> dict[str, Any]:
    """A ServingExperiment named `name` whose spec is `spec`: its sections as keywords (model=, server=,
    load=, slo=, dataPath= ...). The model defaults to the tiny one; a section given as None is left out (a
    spec without a model, say)."""
    sections = {"model": TINY, **spec}
    body = {key: copy.deepcopy(value) for key, value in sections.items() if value is not None}
    return {"apiVersion": GROUP_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": body}


def sweep(name: str = "s", /, **spec: Any) -> dict[str, Any]:
    """A ServingSweep named `name` whose spec is `spec` (template=, space=, strategy= ...), as given."""
    body = {key: copy.deepcopy(value) for key, value in spec.items() if value is not None}
    return {"apiVersion": GROUP_VERSION, "kind": SWEEP_KIND, "metadata": {"name": name}, "spec": body}


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` laid over it: mappings merge key by key, anything else is replaced. Neither
    argument is changed."""
    result = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result
