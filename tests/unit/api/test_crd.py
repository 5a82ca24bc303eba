"""The CRD is generated from the spec model and is a structural schema Kubernetes accepts."""

from __future__ import annotations

import json
from typing import Any

from servinglab.api.crd import crd_manifest, spec_schema


def walk(schema: Any) -> list[dict[str, Any]]:
    nodes = []
    if isinstance(schema, dict):
        nodes.append(schema)
        for value in schema.values():
            nodes.extend(walk(value))
    elif isinstance(schema, list):
        for value in schema:
            nodes.extend(walk(value))
    return nodes


def test_schema_is_structural() -> None:
    text = json.dumps(spec_schema())
    for forbidden in ('"$ref"', '"anyOf"', '"$defs"', '"title"', '"additionalProperties": false'):
        assert forbidden not in text
    for node in walk(spec_schema()):
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node


def test_schema_carries_the_spec_bounds_and_enums() -> None:
    server = spec_schema()["properties"]["server"]["properties"]
    assert server["batchSize"]["minimum"] == 1 and server["batchSize"]["maximum"] == 4096
    assert server["precision"]["enum"] == ["fp32", "tf32", "fp16", "bf16"]
    assert server["nodeSelector"]["additionalProperties"] == {"type": "string"}
    load = spec_schema()["properties"]["load"]["properties"]
    assert load["concurrency"]["items"]["minimum"] == 1
    assert spec_schema()["required"] == ["model"]


def test_crd_names_columns_and_status_subresource() -> None:
    crd = crd_manifest()
    assert crd["metadata"]["name"] == "servingexperiments.servinglab.dev"
    assert crd["spec"]["names"]["shortNames"] == ["sx"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "Model",
        "Server",
        "Batch",
        "Delay",
        "Workers",
        "Precision",
        "RPS",
        "P99",
        "State",
        "Verdict",
        "Age",
    ]


def test_the_sweep_crd_is_generated_from_the_sweep_spec_with_its_own_short_name_and_columns() -> None:
    from servinglab.api.crd import sweep_crd_manifest

    crd = sweep_crd_manifest()
    assert crd["metadata"]["name"] == "servingsweeps.servinglab.dev"
    assert crd["spec"]["names"]["shortNames"] == ["ssw"]
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["strategy"]["enum"] == ["grid", "search", "list"]
    assert spec["properties"]["template"]["properties"]["server"]["properties"]["batchSize"]["maximum"] == 4096
    assert spec["properties"]["space"]["properties"]["precision"]["properties"]["values"]["items"]["enum"] == [
        "fp32", "tf32", "fp16", "bf16",
    ]  # fmt: skip
    assert '"$ref"' not in json.dumps(spec) and '"anyOf"' not in json.dumps(spec)
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Model", "Strategy", "Done", "Running", "Total", "Best", "RPS", "State", "Winner", "Age"]
