"""The operator's overhead per experiment: apply -> Succeeded, minus the server's cold start and the load.

    .venv/bin/python benchmarks/operator_overhead.py [--repeats 2] [--no-cache]

Starts the test control plane (the cached Go-built binaries, KWOK, the stand-in kubelet that runs
the pods' containers as local processes: tests/clusterenv), the operator watching one namespace, and
a model cache claim for it (`SERVINGLAB_MODEL_CACHE_CLAIM`, the chart's `modelCache.claimName`).
Then, one after another, experiments on the built-in tiny model and on a user's TorchScript model
fetched over HTTP. For each: the wall time from `kubectl apply` to Succeeded, the server's cold
start (TorchServe's own start, `status.coldStartSeconds`, which includes the init container), the
init container's share (model build or fetch + pack + count), the load (every level's warm-up and
measured time) and what is left: the operator's own overhead (reconcile passes, Job start, results
write-back, status). The first experiment on a model pays for its build or download; a repeat on the
same model is served from the cache.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests")]

from common import table  # noqa: E402

from clusterenv import manifests  # noqa: E402 (after the path)
from clusterenv.controlplane import (  # noqa: E402
    Cluster,
    Kwok,
    LocalControlPlane,
    build_binaries,
    register_nodes,
    remove_tree,
    wait_default_service_account,
)
from clusterenv.experiments import experiment  # noqa: E402
from clusterenv.kubectl import Kubectl  # noqa: E402
from clusterenv.kubelet import LocalKubelet  # noqa: E402
from clusterenv.operatorproc import Operator  # noqa: E402
from servinglab.api.crd import crd_manifest  # noqa: E402
from usermodels import file_server, make_user_models  # noqa: E402


def finished(cluster: Cluster, namespace: str, name: str, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = cluster.kubectl.run("get", "sx", name, "-n", namespace, "-o", "json", check=False)
        if found.returncode == 0:
            body = json.loads(found.stdout)
            states = {c["type"]: c["status"] for c in body.get("status", {}).get("conditions", [])}
            if states.get("Succeeded") == "True" or states.get("Failed") == "True":
                return body
        time.sleep(0.2)
    raise SystemExit(f"{name} did not finish within {timeout} s")


def init_seconds(kubelet: LocalKubelet, pod: str) -> float:
    """How long the stand-in kubelet ran the server pod's init container (model build or fetch)."""
    running = kubelet.pods.get(pod)
    return running.init_seconds if running is not None else 0.0


def run_one(cluster: Cluster, kubelet: LocalKubelet, operator: Operator, namespace: str, name: str,
            model: dict[str, Any]) -> list[str]:  # fmt: skip
    """One experiment on `model`: the table row of its times."""
    document = experiment(name)
    document["spec"]["model"] = model
    document["spec"]["load"] = {"concurrency": [2], "warmupSeconds": 1, "durationSeconds": 3}
    applied = time.monotonic()
    cluster.kubectl.apply(document, namespace=namespace)
    body = finished(cluster, namespace, name)
    wall = time.monotonic() - applied
    status = body["status"]
    if status.get("summary", {}).get("state") != "Succeeded":
        raise SystemExit(f"{name}: {json.dumps(status)[:2000]}\n{operator.log()}")
    load = 4.0 * len(status["results"])  # each level: 1 s warm-up + 3 s measured
    cold = float(status["coldStartSeconds"])
    init = init_seconds(kubelet, status["serverPod"])
    torchserve = cold - init
    return [f"{wall:.1f}", f"{cold:.1f}", f"{init:.1f}", f"{load:.1f}", f"{wall - cold - load:.1f}",
            f"{wall - load - torchserve:.1f}"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-cache", action="store_true", help="Run without the model cache claim.")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="overhead-"))
    control_plane = LocalControlPlane(build_binaries(), workdir)
    control_plane.start()
    kubectl = Kubectl(control_plane.binaries.kubectl, control_plane.kubeconfig)
    kwok = Kwok(control_plane.binaries, workdir, control_plane.kubeconfig)
    kwok.start()
    operator = kubelet = None
    try:
        wait_default_service_account(kubectl)
        register_nodes(kubectl, manifests.default_nodes())
        cluster = Cluster(control_plane.kubeconfig, kubectl, control_plane.binaries, control_plane)
        kubectl.apply(crd_manifest())
        kubectl.wait_established(crd_manifest()["metadata"]["name"])
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        kubectl.apply(*manifests.bound_claim(namespace, "model-cache"))
        cache = {} if args.no_cache else {"SERVINGLAB_MODEL_CACHE_CLAIM": "model-cache"}
        operator = Operator(cluster, namespace, workdir / "operator", extra_env=cache).start()
        pods = Path(tempfile.mkdtemp(prefix="pods-"))
        kubelet = LocalKubelet(kubectl, namespace, pods, cluster.api_server(workdir / "ca.crt"), workdir / "ca.crt")
        kubelet.start()
        (workdir / "models").mkdir()
        models = make_user_models(workdir / "models")
        digest = models.sha256(models.torchscript_classifier)
        rows = []
        with file_server(models.folder) as files:
            url = f"{files.url}/{models.torchscript_classifier.name}"
            cases = {
                "resnet50 (built in)": {"name": "resnet50"},
                "tiny (built in)": {"name": "tiny"},
                "TorchScript over HTTP": {
                    "name": "classifier",
                    "input": {"size": 32},
                    "source": {"url": url, "sha256": digest},
                },
            }
            for label, model in cases.items():
                for attempt in range(1, args.repeats + 1):
                    row = run_one(cluster, kubelet, operator, namespace, f"e{len(rows)}", model)
                    rows.append([label, attempt, *row])
            downloads = len(files.requests)
        print(f"model cache claim: {'none' if args.no_cache else 'model-cache'}; "
              f"downloads of the TorchScript file: {downloads}")  # fmt: skip
        print(table(["model", "run", "apply -> Succeeded s", "cold start s (init included)", "init container s",
                     "load s", "rest s", "overhead s (all but TorchServe's start and the load)"], rows))  # fmt: skip
    finally:
        if kubelet is not None:
            kubelet.stop()
        if operator is not None:
            operator.stop()
        kwok.stop()
        control_plane.stop()
        remove_tree(workdir)


if __name__ == "__main__":
    main()
