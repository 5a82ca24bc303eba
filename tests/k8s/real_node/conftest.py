"""The real node, shared by this package's modules, and the chart installed on it for each module."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterenv import manifests
from clusterenv.controlplane import Cluster, build_binaries
from clusterenv.node import REAL_NODE_NAME, RealNode, node_namespace
from clusterenv.podstate import describe

CHART = Path(__file__).resolve().parents[3] / "charts" / "serving"
RELEASE = "serving"


@pytest.fixture(scope="package")
def node(cluster: Cluster, images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """One real node with the T4 labels, started once for the package (its images imported once)."""
    if cluster.control_plane is None or cluster.control_plane.pki is None:
        pytest.skip("the real node joins the local control plane (--cluster=local, what CI runs)")
    build_binaries("node")  # kubelet, kube-proxy, CoreDNS: not in the cluster's part; built here unless they are
    t4 = {key: value for key, value in manifests.node("t4", gpus=1)["metadata"]["labels"].items()
          if key.startswith("nvidia.com/")}  # fmt: skip
    plane = cluster.control_plane
    real = RealNode(cluster.binaries, tmp_path_factory.mktemp("node"), cluster.kubectl, plane.pki, plane.server,
                    name=REAL_NODE_NAME, labels=t4)  # fmt: skip
    try:
        real.start(list(images.values()))
        print("real node started: " + ", ".join(f"{step} {seconds:.0f} s" for step, seconds in real.timings.items()))
        yield real
    finally:
        real.stop()
        cluster.kubectl.run("delete", "node", real.name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def installed(cluster: Cluster, node: RealNode) -> Iterator[str]:
    """The chart installed with its default images into a namespace whose pods run on the real node: one per
    module, so that no module sees another's experiments."""
    namespace = f"real-{uuid.uuid4().hex[:6]}"
    cluster.kubectl.apply(node_namespace(namespace))
    begun = time.monotonic()
    installed = cluster.helm("install", RELEASE, str(CHART), "-n", namespace, "--take-ownership", "--wait",
                             "--timeout", "300s", "--set", "pollSeconds=1", check=False, timeout=400)  # fmt: skip
    try:
        assert installed.returncode == 0, f"{installed.stderr}\n{describe(cluster, namespace)}"
        print(f"chart installed, operator ready in {time.monotonic() - begun:.1f} s")
        yield namespace
    finally:
        cluster.helm("uninstall", RELEASE, "-n", namespace, "--wait", check=False, timeout=400)
        cluster.kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)
