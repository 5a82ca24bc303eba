"""The `cluster` fixture: a Kubernetes cluster with two simulated Tesla-T4 nodes and a CPU node.

`--cluster=local` (default, what CI runs) builds or reuses the pinned binaries and starts etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and KWOK on free loopback ports with their
own PKI. `--cluster=kind` creates a throw-away kind cluster (Docker machines only; not available on
CI's machines), `--cluster=existing` uses the current KUBECONFIG; both run the same KWOK out of
cluster to add the simulated nodes. Either way everything started is stopped at the end of the session, also
when tests fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterenv import manifests
from clusterenv.controlplane import (
    Cluster,
    Kwok,
    LocalControlPlane,
    build_binaries,
    register_nodes,
    remove_tree,
    wait_default_service_account,
)
from clusterenv.kubectl import Kubectl
from clusterenv.kubelet import LocalKubelet
from clusterenv.monitoring import DcgmExporter, Prometheus
from clusterenv.operatorproc import Operator
from servinglab.api.crd import crd_manifest, sweep_crd_manifest

REAL_NODE_PACKAGE = Path(__file__).parent / "real_node"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real node's tests last (their order kept) in a plain `pytest tests/k8s`: on a cold machine the
    images they need are still building when the cluster tests start, and the other tests need none.
    (`make test` runs them as a session of their own, which waits for the images.)"""
    items.sort(key=lambda item: REAL_NODE_PACKAGE in item.path.parents)  # stable: False first


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    binaries = build_binaries("cluster")  # the real node's own binaries: its package asks for them
    workdir = Path(tempfile.mkdtemp(prefix="servinglab-k8s-"))
    control_plane: LocalControlPlane | None = None
    kwok: Kwok | None = None
    kind_cluster: str | None = None
    choice = request.config.getoption("--cluster")
    try:
        if choice == "local":
            control_plane = LocalControlPlane(binaries, workdir)
            control_plane.start()
            kubeconfig = control_plane.kubeconfig
        elif choice == "kind":
            if shutil.which("kind") is None or shutil.which("docker") is None:
                pytest.fail("--cluster=kind needs the kind and docker commands")  # a request, never a skip
            kind_cluster, kubeconfig = f"servinglab-{uuid.uuid4().hex[:6]}", workdir / "kind.kubeconfig"
            subprocess.run(
                [
                    "kind",
                    "create",
                    "cluster",
                    "--name",
                    kind_cluster,
                    "--kubeconfig",
                    str(kubeconfig),
                    "--wait",
                    "120s",
                ],
                check=True,
            )
        else:
            kubeconfig = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
        kubectl = Kubectl(binaries.kubectl, kubeconfig)
        kwok = Kwok(binaries, workdir, kubeconfig)
        kwok.start()
        wait_default_service_account(kubectl)
        register_nodes(kubectl, manifests.default_nodes())
        yield Cluster(kubeconfig, kubectl, binaries, control_plane)
    finally:
        if kwok is not None:
            kwok.stop()
        if control_plane is not None:
            control_plane.stop()
        if kind_cluster is not None:
            subprocess.run(["kind", "delete", "cluster", "--name", kind_cluster], check=False)
        remove_tree(workdir)


@pytest.fixture()
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting for finalisation). The API server
    enforces the `restricted` Pod Security Standard there, so every pod the operator or the chart
    creates is proven compliant: a non-compliant one is refused."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl.apply(
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted",
                                               "pod-security.kubernetes.io/enforce-version": "latest"}}}
    )  # fmt: skip
    yield name
    cluster.kubectl.run("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def monitoring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DcgmExporter, Prometheus]]:
    exporter = DcgmExporter().start()
    prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"), exporter.port).start()
    yield exporter, prometheus
    prometheus.stop()
    exporter.stop()


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> None:
    for manifest in (crd_manifest(), sweep_crd_manifest()):
        cluster.kubectl.apply(manifest)
        cluster.kubectl.wait_established(manifest["metadata"]["name"])


@pytest.fixture()
def operator(cluster: Cluster, crd: None, namespace: str, tmp_path: Path) -> Iterator[Operator]:
    running = Operator(cluster, namespace, tmp_path).start()
    yield running
    running.stop()


@pytest.fixture()
def kubelet_factory(
    cluster: Cluster, namespace: str, tmp_path: Path, monitoring: tuple[DcgmExporter, Prometheus]
) -> Iterator[Callable[..., LocalKubelet]]:
    exporter, prometheus = monitoring
    started: list[LocalKubelet] = []
    scraped: list[str] = []

    def server_started(pod: str, metrics_port: int) -> None:
        exporter.pods.append((namespace, pod))
        scraped.append(f"127.0.0.1:{metrics_port}")
        prometheus.scrape(scraped[-1], {"namespace": namespace, "pod": pod})

    def make(**options: Any) -> LocalKubelet:
        api = cluster.api_server(tmp_path / "ca.crt")
        pods = Path(tempfile.mkdtemp(prefix="pods-"))  # short paths: unix sockets live under it
        kubelet = LocalKubelet(cluster.kubectl, namespace, pods, api, tmp_path / "ca.crt", server_started, **options)
        started.append(kubelet.start())
        scraped.append(f"127.0.0.1:{kubelet.cadvisor.port}")
        prometheus.scrape_kubelet(scraped[-1])
        return kubelet

    yield make
    try:
        for kubelet in started:
            kubelet.stop()
    finally:
        prometheus.forget(scraped)
