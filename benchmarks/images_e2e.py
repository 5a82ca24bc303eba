"""The images' sizes and build time, and the wall time of the container end-to-end chain on a real node.

    .venv/bin/python benchmarks/images_e2e.py [--cold]

1. `hack/images.sh` with the stand-ins, as the test suite runs it (`--cold` first removes the images
   and the debootstrap base, so that everything is built from nothing: torch from PyPI);
2. each image's size;
3. the test control plane and a real node (tests/clusterenv/node.py): containerd, the image import
   (`podman save` straight into `ctr import`), CoreDNS, the kubelet until the node is Ready, kube-proxy;
4. `helm install` of the chart with the built operator image, until the operator is available;
5. an experiment of the tiny model from `kubectl apply` to Succeeded, with the server's cold start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

from common import table  # noqa: E402

from clusterenv import manifests  # noqa: E402 (after the path)
from clusterenv.controlplane import (  # noqa: E402
    Cluster,
    LocalControlPlane,
    build_binaries,
    remove_tree,
    wait_default_service_account,
)
from clusterenv.experiments import experiment, wait_finished  # noqa: E402
from clusterenv.kubectl import Kubectl  # noqa: E402
from clusterenv.node import REAL_NODE_NAME, RealNode, image_engine, node_namespace  # noqa: E402

ENGINE = image_engine()  # the engine the node takes its images from


def timed(what: str, step: object, figures: list[list[str]]) -> object:
    begun = time.monotonic()
    result = step() if callable(step) else None
    figures.append([what, f"{time.monotonic() - begun:.1f} s"])
    print(f"{what}: {time.monotonic() - begun:.1f} s", flush=True)
    return result


def build_images(cold: bool) -> dict[str, str]:
    if cold:
        labelled = subprocess.run([*ENGINE, "images", "-q", "--filter", "label=dev.servinglab.inputs"],
                                  capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
        subprocess.run([*ENGINE, "rmi", "-f", *labelled, "localhost/servinglab/python-standin:3.11-bookworm"],
                       capture_output=True, check=False)  # fmt: skip
        subprocess.run([*ENGINE, "image", "prune", "-f"], capture_output=True, check=False)
    env = {
        **os.environ,
        "STANDIN": "1",
        "TORCH_INDEX_URL": os.environ.get("TORCH_INDEX_URL", "https://pypi.org/simple"),
    }
    built = subprocess.run([ROOT / "hack/images.sh"], env=env, capture_output=True, text=True, check=True)
    return {name.rsplit("/", 1)[1].split(":")[0]: name for name in built.stdout.split()}


def measure_images(cold: bool, steps: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """Build (or find) the images; (their names, each image's size)."""
    images = timed(f"hack/images.sh ({'from nothing' if cold else 'as found'})", lambda: build_images(cold), steps)
    assert isinstance(images, dict)
    sizes = []
    for name in images.values():
        size = subprocess.run([*ENGINE, "image", "inspect", "--format", "{{.Size}}", name],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
        sizes.append([name, f"{int(size) / 1e6:,.0f} MB"])
    return list(images.values()), sizes


def run_experiment(cluster: Cluster, namespace: str) -> dict[str, Any]:
    cluster.kubectl.apply(experiment("bench"), namespace=namespace)
    return wait_finished(cluster, namespace, "bench", lambda: "", timeout=480)


def measure_chain(images: list[str], steps: list[list[str]]) -> None:
    """Control plane, real node, chart, one experiment; each step's wall time."""
    binaries = build_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="servinglab-bench-"))
    plane = LocalControlPlane(binaries, workdir / "cp")
    node: RealNode | None = None
    namespace = "bench-real"
    try:
        timed("control plane", plane.start, steps)
        kubectl = Kubectl(binaries.kubectl, plane.kubeconfig)
        cluster = Cluster(plane.kubeconfig, kubectl, binaries, plane)
        wait_default_service_account(kubectl)
        assert plane.pki is not None
        labels = manifests.node("t4", gpus=1)["metadata"]["labels"]
        t4 = {key: value for key, value in labels.items() if key.startswith("nvidia.com/")}
        (workdir / "node").mkdir()
        node = RealNode(binaries, workdir / "node", kubectl, plane.pki, plane.server, name=REAL_NODE_NAME, labels=t4)
        timed("real node", lambda: node.start(images), steps)
        steps += [[f"  {name}", f"{seconds:.1f} s"] for name, seconds in node.timings.items()]
        kubectl.apply(node_namespace(namespace))
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
        install = [str(binaries.helm), "install", "serving", str(ROOT / "charts/serving"), "-n", namespace,
                   "--wait", "--timeout", "300s", "--set", "pollSeconds=1"]  # fmt: skip
        timed("helm install until the operator is available",
              lambda: subprocess.run(install, env=env, check=True, capture_output=True), steps)  # fmt: skip
        body = timed("experiment: kubectl apply -> Succeeded (2 levels, 1 s warm-up + 3 s each)",
                     lambda: run_experiment(cluster, namespace), steps)  # fmt: skip
        assert isinstance(body, dict)
        status = body["status"]
        if not any(c["type"] == "Succeeded" and c["status"] == "True" for c in status["conditions"]):
            raise SystemExit(f"the experiment failed: {json.dumps(status['conditions'], indent=1)}")
        cold_start = f"{status['coldStartSeconds']} s"
        steps.append(["  of which the server's cold start (init container included)", cold_start])
        print(json.dumps(status.get("summary"), indent=1))
    finally:
        if node is not None:
            node.stop()
        plane.stop()
        remove_tree(workdir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="remove the images and the base first")
    steps: list[list[str]] = []
    images, sizes = measure_images(parser.parse_args().cold, steps)
    measure_chain(images, steps)
    print(table(["image", "size"], sizes))
    print(table(["step", "wall time"], steps))


if __name__ == "__main__":
    main()
