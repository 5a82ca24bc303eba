"""The experiment spec: defaults, bounds, and error messages that name the field and the value."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from servinglab.api import Precision, SpecError, load_experiment, parse_experiment
from support.manifests import experiment
from support.paths import EXAMPLES


def minimal() -> dict[str, Any]:
    return experiment("demo")


def with_spec(path: str, value: Any) -> dict[str, Any]:
    """minimal() with spec.<path> set (dotted path, intermediate mappings created)."""
    document = copy.deepcopy(minimal())
    node = document["spec"]
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return document


def problems(document: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_experiment(document)
    return info.value.problems


@pytest.mark.parametrize("name", ["experiment-smoke.yaml", "experiment-halfp.yaml", "experiment-litserve-smoke.yaml"])
def test_examples_are_valid(name: str) -> None:
    experiment = load_experiment(EXAMPLES / name)
    assert experiment.spec.load.concurrency


def test_defaults_fill_a_minimal_experiment() -> None:
    spec = parse_experiment(minimal()).spec
    assert spec.server.batch_size == 1
    assert spec.server.workers == 1
    assert spec.server.precision is Precision.FP32
    assert spec.load.warmup_seconds > 0
    assert spec.slo.p99_latency_ms is None


def test_halfp_example_carries_the_cluster_settings() -> None:
    spec = load_experiment(EXAMPLES / "experiment-halfp.yaml").spec
    assert spec.server.precision is Precision.FP16
    assert spec.server.node_selector == {"nvidia.com/gpu.product": "Tesla-T4"}
    assert spec.server.tolerations[0].key == "nvidia.com/gpu"
    assert spec.load.concurrency == [1, 8, 32, 64, 128, 256]


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("server.batchSize", 0, "spec.server.batchSize: 0 is below the minimum 1"),
        ("server.batchSize", 5000, "spec.server.batchSize: 5000 is above the maximum 4096"),
        ("server.maxBatchDelayMs", 0, "spec.server.maxBatchDelayMs: 0 is below the minimum 1"),
        ("server.workers", -2, "spec.server.workers: -2 is below the minimum 1"),
        ("server.precision", "fp8", "spec.server.precision: 'fp8' is not one of"),
        ("load.durationSeconds", 0, "spec.load.durationSeconds: 0 is below the exclusive minimum 0"),
        ("load.concurrency", [1, 0], "spec.load.concurrency[1]: 0 is below the minimum 1"),
        ("load.concurrency", [4, 4], "spec.load.concurrency: level 4 appears twice"),
        ("load.concurrency", [], "spec.load.concurrency: [] has 0 items"),
        ("server.image", "pytorch/torchserve:latest", "spec.server.image: 'pytorch/torchserve:latest'"),
        ("server.image", "pytorch/torchserve", "has no tag"),
        ("server.resources", {"requests": {"gpu": "1"}}, "spec.server.resources.requests: 'gpu'"),
        ("metrics.prometheusUrl", "prom:9090", "spec.metrics.prometheusUrl: 'prom:9090' does not match"),
        ("server.batchSiz", 8, "spec.server.batchSiz: unknown field"),
        # strict types, as the API server's schema: no coercion
        ("server.batchSize", True, "spec.server.batchSize: True"),
        ("server.batchSize", "8", "spec.server.batchSize: '8'"),
        ("server.batchSize", 1.5, "spec.server.batchSize: 1.5"),
        ("load.durationSeconds", "10", "spec.load.durationSeconds: '10'"),
        ("cleanup.deleteServer", "yes", "spec.cleanup.deleteServer: 'yes'"),
    ],
)
def test_bad_values_are_named_with_field_and_value(path: str, value: Any, expected: str) -> None:
    found = problems(with_spec(path, value))
    assert any(expected in problem for problem in found), found


def test_unknown_builtin_model_without_archive_is_refused() -> None:
    found = problems(with_spec("model.name", "bert"))
    assert any(p.startswith("spec.model: ") and "'bert' is not a built-in model" in p for p in found)


def test_every_problem_is_reported_at_once() -> None:
    document = with_spec("server.batchSize", 0)
    document["spec"]["server"]["workers"] = 0
    document["metadata"]["name"] = "Not_A_Name"
    found = problems(document)
    assert len(found) == 3
    assert any(p.startswith("metadata.name: 'Not_A_Name' is not a DNS-1123 label") for p in found)


def test_wrong_kind_and_missing_spec() -> None:
    document = minimal()
    document["kind"] = "Deployment"
    del document["spec"]
    found = problems(document)
    assert any(p.startswith("kind: 'Deployment' is not one of") for p in found)
    assert "spec: required field is missing" in found


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump(minimal()) + "---\n" + yaml.safe_dump(minimal()))
    with pytest.raises(SpecError, match="expected exactly one document, found 2"):
        load_experiment(two)
    with pytest.raises(SpecError, match="cannot read file"):
        load_experiment(tmp_path / "missing.yaml")


def test_validate_command_exit_codes(tmp_path: Path, servinglab_cmd: list[str]) -> None:
    good = subprocess.run(
        [*servinglab_cmd, "validate", str(EXAMPLES / "experiment-smoke.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert good.returncode == 0, good.stderr
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text(yaml.safe_dump(with_spec("server.batchSize", 0)))
    bad = subprocess.run([*servinglab_cmd, "validate", str(bad_file)], capture_output=True, text=True, check=False)
    assert bad.returncode == 1
    assert "spec.server.batchSize: 0 is below the minimum 1" in bad.stderr
