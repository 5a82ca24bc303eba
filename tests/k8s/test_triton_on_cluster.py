"""A Triton experiment on the test cluster: the operator deploys Triton's pod through the seam (its init
container lays out the repository entry, the server container runs the Triton environment's launcher), the
stand-in kubelet runs it as local processes, readiness is Triton's own word, and the load Job speaks the
KServe v2 protocol, checks the configuration Triton serves and reads its metrics through the Service; the chart's
Triton dashboard shows the run; Triton's repository API on the inference port loads nothing."""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, sweep, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.monitoring import DcgmExporter, Prometheus, grafana_expression, panel_queries
from clusterenv.operatorproc import Operator
from servinglab.servers.triton.env import TritonEnv

pytestmark = [pytest.mark.k8s, pytest.mark.triton]

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "serving" / "dashboards" / "triton.json"


def test_a_triton_experiment_succeeds_with_triton_s_breakdown_and_its_dashboard_shows_it(
    cluster: Cluster,
    namespace: str,
    operator: Operator,
    kubelet_factory: Callable[..., LocalKubelet],
    monitoring: tuple[DcgmExporter, Prometheus],
    triton_env: TritonEnv,
) -> None:
    kubelet = kubelet_factory()
    document = experiment("tiny-triton", kind="triton", batchSize=4, maxBatchDelayMs=20, workers=2)
    document["spec"]["cleanup"] = {"deleteServer": False}  # its server stays, for the foreign load below
    cluster.kubectl.apply(document, namespace=namespace)
    body = wait_finished(cluster, namespace, "tiny-triton", operator.log)
    status = body["status"]
    assert condition(body, "Succeeded")["status"] == "True", (status, operator.log(), kubelet.errors)
    assert condition(body, "ServerReady")["status"] == "True"

    assert status["coldStartSeconds"] > 0
    stored = cluster.kubectl.get("configmap", status["resultsRef"]["name"], "-n", namespace)
    levels = json.loads(stored["data"]["results.json"])["results"]
    assert [level["concurrency"] for level in levels] == [1, 4]
    for level in levels:
        assert level["errors"] == 0 and level["requests"] > 0
        assert level["server"]["serverRequests"] >= level["requests"]  # Triton's own count, through the Service
        assert level["server"]["meanBatchSize"] > 0  # counters sampled mid-batch: one user can show 0.99

    # anyone who reaches the inference port (the Service's) is refused a load of another configuration (or
    # model.py): the pod's Triton has no model control, and it still serves the spec's configuration
    (server,) = [pod for pod in kubelet.pods.values() if pod.labels.get("app.kubernetes.io/component") == "server"]
    inference = f"http://127.0.0.1:{server.ports[server.named_ports['inference']]}"
    served = json.loads(urllib.request.urlopen(f"{inference}/v2/models/tiny/config", timeout=30).read())
    served["dynamic_batching"].pop("preferred_batch_size")  # derived from max_batch_size: a valid override
    override = json.dumps({"parameters": {"config": json.dumps(served | {"max_batch_size": 1})}}).encode()
    load = urllib.request.Request(f"{inference}/v2/repository/models/tiny/load", data=override, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(load, timeout=60)
    assert refused.value.code == 503 and b"explicit model load / unload is not allowed" in refused.value.read()
    after = json.loads(urllib.request.urlopen(f"{inference}/v2/models/tiny/config", timeout=30).read())
    assert (after["max_batch_size"], sum(int(g["count"]) for g in after["instance_group"])) == (4, 2)

    # every query of the chart's Triton dashboard has data from this run (Prometheus scraped the pod)
    _, prometheus = monitoring
    dashboard = json.loads(DASHBOARD.read_text())
    at = float(levels[-1]["windowEnd"])
    missing = [
        title
        for title, query in panel_queries(dashboard)
        if not [s for s in prometheus.query(grafana_expression(query), at) if math.isfinite(float(s["value"][1]))]
    ]
    assert not missing, missing
    for variable in (v for v in dashboard["templating"]["list"] if v["type"] == "query"):
        metric, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"]["query"]).groups()
        assert any(label in labels for labels in prometheus.series(grafana_expression(metric))), variable["name"]


def test_one_sweep_on_the_cluster_compares_the_three_servers_each_at_its_best(
    cluster: Cluster,
    namespace: str,
    operator: Operator,
    kubelet_factory: Callable[..., LocalKubelet],
    triton_env: TritonEnv,
) -> None:
    """A sweep whose kind axis covers TorchServe, LitServe and Triton: a trial per server, each a child
    experiment with its server's own pod, rolled up into each server's best and one winner."""
    kubelet = kubelet_factory()
    template = experiment("template")["spec"]
    template["load"] = {"concurrency": [4], "warmupSeconds": 0.5, "durationSeconds": 2}
    space = {"kind": {"values": ["torchserve", "litserve", "triton"]}, "batchSize": {"values": [4]}}
    document = sweep("three-servers", template, strategy="grid", parallelism=2, confirm={"rounds": 0}, space=space)
    cluster.kubectl.apply(document, namespace=namespace)

    def finished() -> bool:
        body = cluster.kubectl.get("servingsweep", "three-servers", "-n", namespace)
        return (body.get("status") or {}).get("summary", {}).get("state") in ("Succeeded", "Failed")

    cluster.kubectl.wait_for(finished, 600, "the three-server sweep")
    status = cluster.kubectl.get("servingsweep", "three-servers", "-n", namespace)["status"]
    assert status["summary"]["state"] == "Succeeded", (status, operator.log(), kubelet.errors)
    trials = cluster.kubectl.get("sx", "-n", namespace, "-l", "servinglab.dev/sweep=three-servers")["items"]
    kinds = {t["metadata"]["labels"]["servinglab.dev/server-kind"]: t for t in trials}
    assert sorted(kinds) == ["litserve", "torchserve", "triton"]
    for kind, trial in kinds.items():
        assert trial["spec"]["server"]["kind"] == kind
        assert condition(trial, "Succeeded")["status"] == "True", (kind, trial["status"])
    assert {best["config"]["kind"] for best in status["bestPerKind"]} == {"torchserve", "litserve", "triton"}
    assert status["best"]["trial"] in {best["trial"] for best in status["bestPerKind"]}
