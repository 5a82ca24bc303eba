"""`servinglab operator` as a child process of the cluster tests, watching one namespace (or several).

An operator that loses its Lease exits with 70 so that it stops acting (servinglab.k8s.main); in a cluster its
Deployment starts it again. The harness does the same, unless a test asks to see that exit (`restart=False`):
on a busy host a renewal can miss its deadline while the API server is slow, and an operator left dead would
fail whichever test was running, long after, as a resource nothing finished.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from clusterenv.controlplane import Cluster
from servinglab.servers.process import free_ports

SERVINGLAB = str(Path(sys.executable).with_name("servinglab"))
#: servinglab.k8s.main's exit when its Lease can no longer be trusted.
LOST_LEASE_EXIT = 70


class Operator:
    """`servinglab operator` as a child process watching one namespace."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        workdir: Path,
        extra_env: dict[str, str] | None = None,
        also_watch: tuple[str, ...] = (),
        restart: bool = True,
    ) -> None:
        self.cluster, self.namespace, self.workdir = cluster, namespace, workdir
        self.extra_env = extra_env or {}
        self.also_watch = also_watch
        self.restart = restart
        self.restarts = 0  # times it was started again after losing its Lease
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # a restart and a stop never cross: nothing is started after stop()
        self._supervisor: threading.Thread | None = None

    def start(self) -> Operator:
        if self._supervisor is not None and self._stopping.is_set():
            self._supervisor.join(timeout=5)  # a stopped one ends within its 0.5 s wait: never two, never none
        with self._lock:
            self._stopping.clear()
            self._launch()
        if self.restart and (self._supervisor is None or not self._supervisor.is_alive()):
            self._supervisor = threading.Thread(target=self._supervise, name=f"operator-{self.namespace}", daemon=True)
            self._supervisor.start()
        return self

    def _supervise(self) -> None:
        """Start it again when it exits after losing its Lease, as its Deployment would; any other exit stays."""
        while not self._stopping.wait(0.5):
            with self._lock:
                process = self.process
                if self._stopping.is_set() or process is None or process.poll() is None:
                    continue
                if process.returncode != LOST_LEASE_EXIT:
                    return
                self.restarts += 1
                with (self.workdir / "operator.log").open("a") as log:
                    log.write(f"[test harness] exited {LOST_LEASE_EXIT} (lost its Lease): started again "
                              f"({self.restarts})\n")  # fmt: skip
                self._launch()

    def _launch(self) -> None:
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

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def kill(self) -> None:
        """SIGKILL: no cleanup handler runs, the Lease is not handed back, a write in flight is cut off."""
        with self._lock:
            self._stopping.set()
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def log(self) -> str:
        return (self.workdir / "operator.log").read_text(errors="replace")[-5000:]

    def exported(self) -> str:
        """What its metrics endpoint shows now (Prometheus' text format)."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            return str(response.read().decode())
