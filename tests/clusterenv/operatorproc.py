"""`servinglab operator` as a child process of the cluster tests, watching one namespace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from clusterenv.controlplane import Cluster
from servinglab.local_server import free_ports

SERVINGLAB = str(Path(sys.executable).with_name("servinglab"))


class Operator:
    """`servinglab operator` as a child process watching one namespace."""

    def __init__(self, cluster: Cluster, namespace: str, workdir: Path) -> None:
        self.cluster, self.namespace, self.workdir = cluster, namespace, workdir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Operator:
        metrics, liveness = free_ports(2)
        self.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        env = {
            **self.cluster.env,
            "SERVINGLAB_METRICS_PORT": str(metrics),
            "SERVINGLAB_POLL_SECONDS": "1",
            "SERVINGLAB_UNSCHEDULABLE_GRACE_SECONDS": "3",
        }
        log = (self.workdir / "operator.log").open("ab")
        self.process = subprocess.Popen(
            [SERVINGLAB, "operator", "--namespace", self.namespace,
             "--liveness", f"http://127.0.0.1:{liveness}/healthz"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def log(self) -> str:
        return (self.workdir / "operator.log").read_text(errors="replace")[-5000:]
