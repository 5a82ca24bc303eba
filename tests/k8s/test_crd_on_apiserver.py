"""The generated CRDs on the real API server: served, examples accepted, bad values rejected by the
server with the field named, and finished statuses (typed, generated schema) stored and read back
unchanged."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from clusterenv.controlplane import Cluster
from servinglab.api import conditions as cond
from servinglab.api import grid, parse_experiment, parse_sweep
from servinglab.api.capacity import CapacitySpec
from servinglab.api.ceiling import ModelDescription
from servinglab.api.crd import crd_manifest, sweep_crd_manifest
from servinglab.api.results import ExperimentResults, to_json
from servinglab.api.status import ExperimentStatus, ResultsRef, SweepStatus
from servinglab.k8s.experiment.status import summary_of
from servinglab.sweep import plan

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
    assert header.split()[:9] == ["NAME", "MODEL", "SERVER", "BATCH", "DELAY", "WORKERS", "PRECISION", "RPS", "P99"]
    assert row.split()[:7] == ["resnet50-halfp", "resnet50", "torchserve", "64", "50", "4", "fp16"]


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


# -- the typed status, stored and read back ----------------------------------------------------------

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "v0.1.0"


def status_of_this_version() -> ExperimentStatus:
    """A finished experiment's status as this operator writes it, from a local run's document that has
    every kind of figure (open loop, repeats, stability, generator verdicts, peak rate, ceiling, model)."""
    local = ExperimentResults.model_validate_json((OLD / "results-open.json").read_text())
    levels = [level.compact() for level in local.results]
    model = local.model_info or ModelDescription(
        name="tiny", source="built-in:tiny", format="builtin", parameters=2_906, flops_per_inference=3_244_672
    )
    conditions = cond.set_condition([], cond.SUCCEEDED, True, "Measured", "results are in status.results", 1)
    conditions = cond.set_condition(conditions, cond.GPU_METRICS, False, "NotConfigured", "no Prometheus URL", 1)
    return ExperimentStatus(
        conditions=conditions, observed_generation=1, started_at="2026-11-23T10:00:00Z", server_pod="open-server-0",
        cold_start_seconds=3.25, model=model, results=levels,
        summary=summary_of(levels, 2000.0, "Succeeded", local.peak_rate),
        results_ref=ResultsRef(name="open-results", key="results.json"),
        peak_rate=local.peak_rate, ceiling=local.ceiling, generator_key_secret="open-load-key-x7k2p",
        finished_at="2026-11-23T10:01:00Z", cleaned_up_at="2026-11-23T10:01:02Z",
    )  # fmt: skip


def stored_status(cluster: Cluster, namespace: str, kind: str, document: dict[str, Any], status: BaseModel) -> Any:
    """Apply `document`, write `status` through the status subresource, read the object back."""
    cluster.kubectl.apply(document, namespace=namespace)
    name = document["metadata"]["name"]
    patch = json.dumps({"status": to_json(status)})
    cluster.kubectl.run("patch", kind, name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch)
    return cluster.kubectl.get(kind, name, "-n", namespace)["status"]


@pytest.mark.parametrize("written", ["this version", "status-smoke", "status-open"])
def test_a_finished_experiments_status_is_stored_and_read_back_unchanged(
    cluster: Cluster, namespace: str, crd_installed: None, written: str
) -> None:
    status = (
        status_of_this_version()
        if written == "this version"
        else ExperimentStatus.model_validate_json((OLD / f"{written}.json").read_text())
    )
    document = yaml.safe_load((EXAMPLES / "experiment-smoke.yaml").read_text())
    stored = stored_status(cluster, namespace, "sx", document, status)
    # nothing pruned by the generated schema, nothing changed: the same typed status, field for field
    assert ExperimentStatus.model_validate(stored) == status
    assert to_json(ExperimentStatus.model_validate(stored)) == to_json(status)


@pytest.mark.parametrize("fronts", ["as written", "with a cost front"])
def test_a_finished_sweeps_status_is_stored_and_read_back_unchanged(
    cluster: Cluster, namespace: str, crd_installed: None, fronts: str
) -> None:
    status = SweepStatus.model_validate_json((OLD / "status-sweep.json").read_text())
    assert status.trials and status.best is not None and status.front  # a finished sweep, every part present
    if fronts == "with a cost front":  # priced points with p99 bounds, as this version writes them
        priced = [
            p.model_copy(
                update={
                    "cost_per_million": 1.25 * (rank + 1),
                    "p99_lower_ms": p.p99_latency_ms * 0.9,
                    "p99_upper_ms": p.p99_latency_ms * 1.1,
                }
            )
            for rank, p in enumerate(status.front)
        ]
        status = status.model_copy(update={"front": priced, "cost_front": priced[:1]})  # fmt: skip
    document = yaml.safe_load((EXAMPLES / "sweep-smoke.yaml").read_text())
    stored = stored_status(cluster, namespace, "servingsweep", document, status)
    assert SweepStatus.model_validate(stored) == status
    assert to_json(SweepStatus.model_validate(stored)) == to_json(status)


def test_a_status_the_schema_does_not_describe_is_refused(
    cluster: Cluster, namespace: str, crd_installed: None
) -> None:
    document = yaml.safe_load((EXAMPLES / "experiment-smoke.yaml").read_text())
    cluster.kubectl.apply(document, namespace=namespace)
    patch = json.dumps({"status": {"results": [{"concurrency": "four", "throughputRps": 1.0}]}})
    refused = cluster.kubectl.run(
        "patch", "sx", document["metadata"]["name"], "-n", namespace, "--subresource=status", "--type=merge",
        "-p", patch, check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "status.results[0].concurrency" in refused.stderr, refused.stderr


def test_the_capacity_plans_hpa_is_accepted_by_the_api_server(cluster: Cluster, namespace: str) -> None:
    """The exported HorizontalPodAutoscaler (autoscaling/v2, a Pods metric) in a strict server-side dry run;
    the same document with a target that is not a quantity is refused, so the dry run does check it."""
    found = plan.plan(400.0, 31.25, CapacitySpec(peak_rps=1000, headroom=0.2, min_replicas=2), None)
    hpa = plan.hpa(found, "resnet50-t4-best").dumped()
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "10"

    def dry_run(document: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl.run(
            "create", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-", stdin=json.dumps(document),
            check=False,
        )  # fmt: skip

    accepted = dry_run(hpa)
    assert accepted.returncode == 0, accepted.stderr
    bad = json.loads(json.dumps(hpa))
    bad["spec"]["metrics"][0]["pods"]["target"]["averageValue"] = "ten"
    assert dry_run(bad).returncode != 0


#: The published CRDs of KEDA's ScaledObject and KServe's InferenceService (see the folder's README).
PUBLISHED_CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "crds"


def strict_dry_run(cluster: Cluster, namespace: str, document: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """A server-side dry-run create with strict field validation: the schema's types, and no unknown field."""
    return cluster.kubectl.run(
        "create", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-", stdin=json.dumps(document),
        check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def published_crds(cluster: Cluster) -> None:
    """KEDA's and KServe's CRDs, as their projects publish them, installed and established."""
    for path in sorted(PUBLISHED_CRDS.glob("*.yaml*")):
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        crd = yaml.safe_load(text)
        # server-side: KServe's CRD (2 MB) is larger than the annotation a client-side apply keeps
        cluster.kubectl.run("apply", "--server-side", "-f", "-", stdin=json.dumps(crd))
        cluster.kubectl.wait_established(crd["metadata"]["name"])


def deep_merged(base: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """`part` merged into `base`, mappings key by key (as a user merges an exported part into their own)."""
    merged = dict(base)
    for key, value in part.items():
        merged[key] = (
            deep_merged(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


#: The smallest InferenceService KServe serves: a predictor with a model format and where the model is.
INFERENCE_SERVICE = {
    "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "resnet50-t4-best"},
    "spec": {"predictor": {"model": {"modelFormat": {"name": "pytorch"}, "storageUri": "gs://models/resnet50"}}},
}  # fmt: skip


def test_the_capacity_plans_keda_and_kserve_exports_are_accepted_by_their_published_crds(
    cluster: Cluster, namespace: str, published_crds: None
) -> None:
    """KEDA's ScaledObject as exported, and KServe's part merged into a minimal InferenceService, in a strict
    server-side dry run against the CRDs KEDA and KServe publish; each with a field of the wrong type is
    refused, naming it, so the dry run does check them."""
    found = plan.plan(400.0, 31.25, CapacitySpec(peak_rps=1000, headroom=0.2, min_replicas=2), None)
    scaled = plan.keda(found, "resnet50-t4-best", "http://prometheus.monitoring:9090").dumped()
    service = deep_merged(INFERENCE_SERVICE, plan.kserve(found, "resnet50-t4-best").dumped())
    assert service["spec"]["predictor"]["minReplicas"] == 2 and "model" in service["spec"]["predictor"]
    for document in (scaled, service):
        accepted = strict_dry_run(cluster, namespace, document)
        assert accepted.returncode == 0, (document["kind"], accepted.stderr)
    bad_scaled = json.loads(json.dumps(scaled))
    bad_scaled["spec"]["minReplicaCount"] = "two"
    bad_service = json.loads(json.dumps(service))
    bad_service["spec"]["predictor"]["maxReplicas"] = "ten"
    for document, field in ((bad_scaled, "spec.minReplicaCount"), (bad_service, "spec.predictor.maxReplicas")):
        refused = strict_dry_run(cluster, namespace, document)
        assert refused.returncode != 0 and field in refused.stderr, (document["kind"], refused.stderr)
