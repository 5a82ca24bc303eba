"""Several load pods on the real control plane: they meet with a key only they hold, behind a
NetworkPolicy of their own, and strangers at the coordinator's port change nothing.

The stand-in kubelet runs the indexed Job's pods as local processes; pod 0's port 7100 is a loopback
port there (no network plugin enforces the NetworkPolicy, so the strangers do reach it, which is what
the key and the handshake deadline must withstand)."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.kubelet import LocalKubelet, RunningPod
from clusterenv.monitoring import DcgmExporter, Prometheus
from clusterenv.operatorproc import Operator
from servinglab.api import API_GROUP
from servinglab.k8s.builders import UID_LABEL
from servinglab.k8s.loadbuilders import GENERATOR_PORT
from servinglab.loadgen import wire

pytestmark = [pytest.mark.k8s, pytest.mark.torchserve]
EXPERIMENT_LABEL = f"{API_GROUP}/experiment"


class Strangers(threading.Thread):
    """Waits for load pod 0 to run, then connects to its generators' port: one client that never says a
    word, one that presents a key of its own. Records what each met."""

    def __init__(self, kubelet: LocalKubelet, job: str) -> None:
        super().__init__(daemon=True)
        self.kubelet, self.dns = kubelet, f"{job}-0.{job}"
        self.met: dict[str, Any] = {}
        self.stop = threading.Event()

    def coordinator(self) -> RunningPod | None:
        while not self.stop.is_set():
            for pod in list(self.kubelet.pods.values()):
                if pod.dns == self.dns and GENERATOR_PORT in pod.ports:
                    return pod
            time.sleep(0.02)
        return None

    def run(self) -> None:
        try:
            self.meet()
        except Exception as exc:  # the test reads what happened from `met`
            self.met["failed"] = repr(exc)

    def meet(self) -> None:
        pod = self.coordinator()
        if pod is None:
            return
        while not self.stop.is_set():  # the first connection it accepts is the silent one
            try:
                silent = socket.create_connection(("127.0.0.1", pod.ports[GENERATOR_PORT]), timeout=2)
                break
            except OSError:
                time.sleep(0.02)
        else:
            return
        connected = time.monotonic()
        with socket.create_connection(("127.0.0.1", pod.ports[GENERATOR_PORT]), timeout=10) as sock:
            try:
                wire.join(sock, wire.new_key())
                self.met["other key"] = "joined"
            except wire.WireError as exc:
                self.met["other key"] = str(exc)
        self.met["other key answered after"] = time.monotonic() - connected
        with silent:
            silent.settimeout(30)
            received = b""
            while chunk := silent.recv(100):
                received += chunk
        self.met["silent"] = received[: len(wire.MAGIC)]
        self.met["silent dropped after"] = time.monotonic() - connected


def test_two_load_pods_meet_with_their_own_key_past_strangers_behind_their_own_network_policy(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet],
    monitoring: tuple[DcgmExporter, Prometheus],
) -> None:  # fmt: skip
    _, prometheus = monitoring
    kubelet = kubelet_factory()
    strangers = Strangers(kubelet, "meet-load")
    strangers.start()
    document = experiment("meet", prometheus.url)
    document["spec"]["load"].update(concurrency=[4], durationSeconds=2, generators=2)
    cluster.kubectl.apply(document, namespace=namespace)
    body = wait_finished(cluster, namespace, "meet", operator.log)
    strangers.stop.set()
    strangers.join(timeout=60)
    status = body["status"]
    assert condition(body, "Succeeded")["status"] == "True", (status["conditions"], kubelet.errors)
    (level,) = status["results"]
    assert level["errors"] == 0 and level["requests"] > 0

    assert "failed" not in strangers.met, strangers.met
    # the strangers were turned away, the silent one within seconds, and neither held anything up
    assert strangers.met["other key"] == "the coordinator refused this generator's key (the two keys differ)"
    assert strangers.met["other key answered after"] < wire.HANDSHAKE_SECONDS
    assert strangers.met["silent"] == wire.MAGIC and strangers.met["silent dropped after"] < wire.HANDSHAKE_SECONDS + 5
    coordinator = next(pod for pod in kubelet.pods.values() if pod.dns == "meet-load-0.meet-load")
    assert coordinator.log is not None
    assert "does not hold this experiment's generator key" in coordinator.log.read_text()

    # the key: a Secret of its own, owned by the experiment, named in status, given to the load pods only
    uid = body["metadata"]["uid"]
    secret = cluster.kubectl.get("secret", status["generatorKeySecret"], "-n", namespace)
    assert [owner["uid"] for owner in secret["metadata"]["ownerReferences"]] == [uid]
    assert secret["immutable"] is True
    key_text = base64.b64decode(secret["data"]["key"]).decode()
    assert len(wire.key_from_text(key_text)) == wire.KEY_BYTES
    job = cluster.kubectl.get("job", "meet-load", "-n", namespace)
    (env,) = [e for e in job["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == wire.KEY_ENV]
    assert env == {"name": wire.KEY_ENV, "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"],
                                                                         "key": "key"}}}  # fmt: skip
    secrets = cluster.kubectl.get("secrets", "-n", namespace)["items"]
    ours = [s["metadata"]["name"] for s in secrets if s["metadata"].get("labels", {}).get(EXPERIMENT_LABEL) == "meet"]
    assert ours == [secret["metadata"]["name"]]  # one key, made once
    readable = json.dumps([cluster.kubectl.get("configmaps", "-n", namespace), body, job]) + operator.log()
    for form in (key_text, key_text.upper(), secret["data"]["key"], base64.b64encode(bytes.fromhex(key_text)).decode()):
        assert form not in readable

    # the NetworkPolicy: this experiment's load pods, reachable on the generators' port from each other only
    policy = cluster.kubectl.get("networkpolicy", "meet-load", "-n", namespace)
    own = {"matchLabels": {"app.kubernetes.io/component": "load", UID_LABEL: uid}}
    assert [owner["uid"] for owner in policy["metadata"]["ownerReferences"]] == [uid]
    assert policy["spec"]["podSelector"] == own and policy["spec"]["policyTypes"] == ["Ingress"]
    port = {"protocol": "TCP", "port": GENERATOR_PORT}
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": own}], "ports": [port]}]
    pods = cluster.kubectl.get("pods", "-n", namespace, "-l", "app.kubernetes.io/component=load")["items"]
    assert len(pods) == 2 and all(pod["metadata"]["labels"][UID_LABEL] == uid for pod in pods)


def test_an_operator_restarted_under_running_load_pods_keeps_their_key_and_their_job(
    tmp_path: Path, cluster: Cluster, namespace: str, operator: Operator,
    kubelet_factory: Callable[..., LocalKubelet],
) -> None:  # fmt: skip
    kubelet = kubelet_factory()
    document = experiment("again")
    document["spec"]["load"].update(concurrency=[2, 4], durationSeconds=4, generators=2)
    cluster.kubectl.apply(document, namespace=namespace)
    cluster.kubectl.wait_for(
        lambda: sum(pod.dns.startswith("again-load-") and not pod.done for pod in list(kubelet.pods.values())) == 2,
        180, "both load pods running",
    )  # fmt: skip
    key_secret = cluster.kubectl.get("sx", "again", "-n", namespace)["status"]["generatorKeySecret"]
    job_uid = cluster.kubectl.get("job", "again-load", "-n", namespace)["metadata"]["uid"]
    operator.kill()  # while the load pods run with the key
    restarted = Operator(cluster, namespace, tmp_path / "restarted").start()
    try:
        body = wait_finished(cluster, namespace, "again", restarted.log)
    finally:
        restarted.stop()
    assert condition(body, "Succeeded")["status"] == "True", (body["status"]["conditions"], kubelet.errors)
    assert body["status"]["generatorKeySecret"] == key_secret
    secrets = cluster.kubectl.get("secrets", "-n", namespace)["items"]
    ours = [s["metadata"]["name"] for s in secrets if s["metadata"].get("labels", {}).get(EXPERIMENT_LABEL) == "again"]
    assert ours == [key_secret]  # no second key
    jobs = cluster.kubectl.get("jobs", "-n", namespace)["items"]
    assert [j["metadata"]["uid"] for j in jobs] == [job_uid]
