"""What the API server would refuse mid-run is refused when the spec is read, naming the field: tolerations,
node selector labels, requests above limits, an experiment name its Services cannot carry, the load pods'
resources. (tests/k8s/test_operator_endings.py checks the same values against a real API server.)"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from servinglab.api import SpecError, parse_experiment, parse_sweep
from servinglab.api.kube import quantity
from support import manifests


def experiment(name: str = "demo", **server: Any) -> dict[str, Any]:
    return manifests.experiment(name, server=server)


def problems(document: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_experiment(document)
    return info.value.problems


@pytest.mark.parametrize(
    ("tolerations", "expected"),
    [
        ([{"effect": "NoSchedule"}], "spec.server.tolerations[0]: an empty key matches every taint and needs operator"),
        ([{"key": "", "operator": "Equal", "value": "x"}], "needs operator: Exists"),
        ([{"key": "a", "operator": "Exists", "value": "x"}], "value: 'x' must be empty when operator is Exists"),
        ([{"key": "a b", "operator": "Exists"}], "key: 'a b' is not a label key"),
        ([{"key": "Example.com/gpu", "operator": "Exists"}], "the prefix before '/' must be a DNS subdomain"),
        ([{"key": "a", "value": "-x"}], "value: '-x' is not a label value"),
        ([{"key": "a", "operator": "Exists", "tolerationSeconds": 30}], "tolerationSeconds needs effect: NoExecute"),
    ],
)  # fmt: skip
def test_tolerations_the_api_server_refuses_are_refused(tolerations: list[dict[str, Any]], expected: str) -> None:
    found = problems(experiment(tolerations=tolerations))
    assert any(expected in problem for problem in found), found


@pytest.mark.parametrize(
    "tolerations",
    [
        [{"operator": "Exists"}],  # every taint
        [{"operator": "Exists", "effect": "NoSchedule"}],
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        [{"key": "dedicated", "operator": "Equal", "value": ""}],
        [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
          "tolerationSeconds": 30}],
    ],
)  # fmt: skip
def test_tolerations_the_api_server_takes_are_taken(tolerations: list[dict[str, Any]]) -> None:
    assert parse_experiment(experiment(tolerations=tolerations)).spec.server.tolerations


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({"nvidia.com/gpu product": "T4"}, "'nvidia.com/gpu product' is not a label key"),
        ({"-gpu": "T4"}, "'-gpu' is not a label key"),
        ({"a/b/c": "T4"}, "the prefix before '/' must be a DNS subdomain"),
        ({"x" * 64: "T4"}, "is not a label key"),
        ({"nvidia.com/gpu.product": "Tesla T4"}, "'Tesla T4' is not a label value"),
        ({"gpu": "y" * 64}, "is not a label value"),
    ],
)
def test_node_selector_labels_the_api_server_refuses_are_refused(selector: dict[str, str], expected: str) -> None:
    found = problems(experiment(nodeSelector=selector))
    assert any(p.startswith("spec.server.nodeSelector: ") and expected in p for p in found), found


def test_node_selector_labels_the_api_server_takes_are_taken() -> None:
    selector = {"nvidia.com/gpu.product": "Tesla-T4", "kubernetes.io/hostname": "gpu_t4.0", "empty": ""}
    assert parse_experiment(experiment(nodeSelector=selector)).spec.server.node_selector == selector


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}, "requests.cpu '2' is above limits.cpu '1500m'"),
        ({"requests": {"memory": "1Gi"}, "limits": {"memory": "1G"}}, "requests.memory '1Gi' is above limits.memory"),
        ({"requests": {"memory": "2k"}, "limits": {"memory": "1999"}}, "requests.memory '2k' is above"),
    ],
)
def test_requests_above_limits_are_refused(resources: dict[str, Any], expected: str) -> None:
    found = problems(experiment(resources=resources))
    assert any(p.startswith("spec.server.resources: ") and expected in p for p in found), found
    load = experiment()
    load["spec"]["load"] = {"resources": resources}
    assert any(p.startswith("spec.load.resources: ") and expected in p for p in problems(load))


def test_requests_up_to_their_limits_and_either_alone_are_taken() -> None:
    for resources in (
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1073741824"}},
        {"requests": {"cpu": "4"}},  # the API defaults nothing above a request with no limit
        {"limits": {"memory": "512Mi"}},
    ):
        assert parse_experiment(experiment(resources=resources)).spec.server.resources.manifest() == resources


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", Fraction(1, 2)), ("1.5", Fraction(3, 2)), ("2Ki", 2048), ("1G", 10**9), ("1Gi", 2**30), ("7", 7)],
)
def test_quantities_are_read_exactly(text: str, value: Fraction | int) -> None:
    assert quantity(text) == value


def test_a_name_its_services_cannot_carry_is_refused_for_experiments_and_sweeps() -> None:
    found = problems(experiment(name="7b-halfp"))
    assert any(p.startswith("metadata.name: '7b-halfp' must start with a letter") for p in found), found
    sweep = manifests.sweep("2024-sweep", template={"model": {"name": "tiny"}}, space={"batchSize": {"values": [1, 2]}})
    with pytest.raises(SpecError) as info:
        parse_sweep(sweep)  # its trials are experiments named after it
    assert any(p.startswith("metadata.name: '2024-sweep' must start with a letter") for p in info.value.problems)
