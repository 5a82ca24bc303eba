"""`servinglab operator` as a child process of the cluster tests, watching one namespace (or several)."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

from clusterenv.controlplane import Cluster
from servinglab.servers.process import free_ports

SERVINGLAB = str(Path(sys.executable).with_name("servinglab"))


class Operator:
    """`servinglab operator` as a child process watching one namespace."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        workdir: Path,
        extra_env: dict[str, str] | None = None,
        also_watch: tuple[str, ...] = (),
    ) -> None:
        self.cluster, self.namespace, self.workdir = cluster, namespace, workdir
        self.extra_env = extra_env or {}
        self.also_watch = also_watch
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Operator:
        metrics, liveness = free_ports(2)
        self.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        self.health_url = f"http://127.0.0.1:{liveness}/healthz"
        env = {
            **self.cluster.env,
            "SERVINGLAB_METRICS_PORT": str(metrics),
            "SERVINGLAB_POLL_SECONDS": "1",
            "SERVINGLAB_UNSCHEDULABLE_GRACE_SECONDS": "3",
            # a killed leader's Lease runs out in 4 s (renewed every 1.3 s), so a standby or restart takes over soon
            "SERVINGLAB_LEASE_SECONDS": "4",
            # as if installed in the namespace it watches (the chart's default): its Lease lives there
            "POD_NAMESPACE": self.namespace,
            **self.extra_env,
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "operator.log").open("ab")
        self.process = subprocess.Popen(
            [SERVINGLAB, "operator", "--namespace", self.namespace,
             *(f"--namespace={other}" for other in self.also_watch),
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

    def kill(self) -> None:
        """SIGKILL: no cleanup handler runs, the Lease is not handed back, a write in flight is cut off."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def log(self) -> str:
        return (self.workdir / "operator.log").read_text(errors="replace")[-5000:]

    def exported(self) -> str:
        """What its metrics endpoint shows now (Prometheus' text format)."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            return str(response.read().decode())
