"""The generated ServingExperiment CRD on the real API server: served, examples accepted, bad
values rejected by the server with the field named."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from clusterenv.controlplane import Cluster
from servinglab.api import grid, parse_experiment, parse_sweep
from servinglab.api.crd import crd_manifest, sweep_crd_manifest

pytestmark = pytest.mark.k8s

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def crd_installed(cluster: Cluster) -> None:
    for manifest in (crd_manifest(), sweep_crd_manifest()):
        cluster.kubectl.apply(manifest)
        cluster.kubectl.wait_established(manifest["metadata"]["name"])
    cluster.kubectl.wait_for(
        lambda: cluster.kubectl.run("get", "sx", check=False).returncode == 0, 30, "servingexperiments served"
    )


@pytest.mark.parametrize(
    "example",
    ["experiment-halfp.yaml", "experiment-smoke.yaml", "experiment-demo.yaml", "experiment-litserve-smoke.yaml"],
)
def test_examples_are_accepted(cluster: Cluster, namespace: str, crd_installed: None, example: str) -> None:
    document = yaml.safe_load((EXAMPLES / example).read_text())
    cluster.kubectl.apply(document, namespace=namespace)
    stored = cluster.kubectl.get("sx", document["metadata"]["name"], "-n", namespace)
    assert stored["spec"]["model"]["name"] == document["spec"]["model"]["name"]
    # the server fills in the schema's defaults; they must be the spec model's defaults
    assert {k: stored["spec"]["server"][k] for k in document["spec"]["server"]} == document["spec"]["server"]
    assert parse_experiment(stored).spec == parse_experiment(document).spec


@pytest.mark.parametrize(
    "example",
    [
        "sweep-smoke.yaml",
        "sweep-t4.yaml",
        "sweep-litserve-writeup.yaml",
        "sweep-litserve-writeup-cpu.yaml",
        "sweep-servers.yaml",
    ],
)
def test_sweep_examples_are_accepted_with_the_same_meaning(
    cluster: Cluster, namespace: str, crd_installed: None, example: str
) -> None:
    document = yaml.safe_load((EXAMPLES / example).read_text())
    cluster.kubectl.apply(document, namespace=namespace)
    stored = cluster.kubectl.get("servingsweep", document["metadata"]["name"], "-n", namespace)
    # what the API server stored (defaults filled in from the generated schema) is the same sweep
    assert grid(parse_sweep(stored).spec) == grid(parse_sweep(document).spec)
    assert parse_sweep(stored).spec == parse_sweep(document).spec


def test_server_rejects_a_bad_sweep_naming_the_fields(cluster: Cluster, namespace: str, crd_installed: None) -> None:
    document = yaml.safe_load((EXAMPLES / "sweep-t4.yaml").read_text())
    document["spec"]["strategy"] = "random"
    document["spec"]["space"]["precision"]["values"] = ["fp8"]
    result = cluster.kubectl.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(document), check=False)
    assert result.returncode != 0
    assert "spec.strategy" in result.stderr and "spec.space.precision.values[0]" in result.stderr


def test_server_rejects_out_of_range_values_naming_the_field(
    cluster: Cluster, namespace: str, crd_installed: None
) -> None:
    document = yaml.safe_load((EXAMPLES / "experiment-halfp.yaml").read_text())
    document["spec"]["server"]["batchSize"] = 0
    document["spec"]["server"]["precision"] = "fp8"
    result = cluster.kubectl.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(document), check=False)
    assert result.returncode != 0
    assert "spec.server.batchSize" in result.stderr
    assert "spec.server.precision" in result.stderr
    assert cluster.kubectl.run("get", "sx", "resnet50-halfp", "-n", namespace, check=False).returncode != 0


def test_printer_columns(cluster: Cluster, namespace: str, crd_installed: None) -> None:
    document = yaml.safe_load((EXAMPLES / "experiment-halfp.yaml").read_text())
    cluster.kubectl.apply(document, namespace=namespace)
    table = cluster.kubectl.run("get", "sx", "-n", namespace).stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:8] == ["NAME", "MODEL", "BATCH", "DELAY", "WORKERS", "PRECISION", "RPS", "P99"]
    assert row.split()[:6] == ["resnet50-halfp", "resnet50", "64", "50", "4", "fp16"]


# (field path, value): values the schema's types refuse, where a lax validator would coerce
BAD_TYPES = [
    ("server.batchSize", True),
    ("server.batchSize", "8"),
    ("server.batchSize", 1.5),
    ("server.maxBatchDelayMs", "5"),
    ("server.precision", 16),
    ("load.durationSeconds", "10"),
    ("load.concurrency", ["4"]),
    ("cleanup.deleteServer", "yes"),
    ("server.batchSiz", 8),  # unknown field: refused with --validate=strict, as by `servinglab validate`
]


@pytest.mark.parametrize(("path", "value"), BAD_TYPES)
def test_validate_and_the_api_server_refuse_the_same_bad_types(
    tmp_path: Path, cluster: Cluster, namespace: str, crd_installed: None, servinglab_cmd: list[str], path: str,
    value: object,
) -> None:  # fmt: skip
    document = yaml.safe_load((EXAMPLES / "experiment-halfp.yaml").read_text())
    *parents, leaf = path.split(".")
    target = document["spec"]
    for key in parents:
        target = target.setdefault(key, {})
    target[leaf] = value
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(document))
    local = subprocess.run([*servinglab_cmd, "validate", str(bad)], capture_output=True, text=True, check=False)
    assert local.returncode != 0 and f"spec.{path}" in local.stderr + local.stdout, local
    server = cluster.kubectl.run(
        "apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-", stdin=json.dumps(document),
        check=False,
    )  # fmt: skip
    assert server.returncode != 0 and f"spec.{path}" in server.stderr, server.stderr
