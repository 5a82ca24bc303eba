"""Run a real Kubernetes control plane and KWOK as local processes, on free 127.0.0.1 ports (the API
server also on the host's address, where a real node's pods reach it: tests/clusterenv/node.py).

`LocalControlPlane` starts etcd, kube-apiserver (own PKI, RBAC, service-account tokens),
kube-controller-manager (all controllers: Deployments, Jobs, garbage collection, service accounts)
and kube-scheduler, each in its own process group and tied to the test process (they die with it).
`Kwok` runs KWOK against any cluster's kubeconfig, managing only nodes annotated as fake, with the
node/pod stages from the binaries cache plus our Job completion stage. `stop()` terminates every
process, kills survivors and removes the work directory.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from clusterenv import manifests
from clusterenv.kubectl import ClusterError, Kubectl
from clusterenv.pki import Pki, make_pki
from servinglab.servers.process import free_ports

REPO = Path(__file__).resolve().parents[2]
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"  # must not overlap the service range


@dataclass(frozen=True)
class Binaries:
    """The cached, version-pinned binaries built by hack/build-control-plane.sh."""

    directory: Path

    def __getattr__(self, name: str) -> Path:
        path = self.directory / name.replace("_", "-")
        if not path.exists():
            raise ClusterError(f"{path} is missing; run hack/build-control-plane.sh")
        return path

    @property
    def kwok_stages(self) -> Path:
        return self.directory / "kwok-stages"


def build_binaries(part: Literal["all", "cluster", "node"] = "all") -> Binaries:
    """Build or reuse the binaries (seconds when cached); SERVINGLAB_K8S_BIN points at a ready dir. `cluster`
    is what a cluster of simulated nodes needs, `node` the real node's own (hack/build-control-plane.sh)."""
    override = os.environ.get("SERVINGLAB_K8S_BIN")
    if override:
        return Binaries(Path(override))
    result = subprocess.run(
        [str(REPO / "hack" / "build-control-plane.sh"), part], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise ClusterError(f"building the control plane failed:\n{result.stderr[-4000:]}")
    return Binaries(Path(result.stdout.strip().splitlines()[-1]))


def _die_with_parent() -> None:
    """Runs in the child before exec: own process group, SIGKILL when the test process dies."""
    os.setsid()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class ProcessGroup:
    """Started processes, stopped in reverse order of start."""

    workdir: Path
    processes: list[Process] = field(default_factory=list)

    def start(self, name: str, command: list[str], env: dict[str, str] | None = None) -> Process:
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as handle:
            popen = subprocess.Popen(
                command,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                env={**os.environ, **(env or {})},
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only async-signal-safe calls
            )
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def wait_until(self, process: Process, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not process.alive():
                raise ClusterError(f"{process.name} exited ({process.popen.returncode}):\n{process.tail()}")
            try:
                if check():
                    return
            except (OSError, urllib.error.URLError, ssl.SSLError, subprocess.SubprocessError):
                pass
            time.sleep(0.25)
        raise ClusterError(f"{process.name}: {what} not reached in {timeout:.0f} s:\n{process.tail()}")

    def stop(self, grace: float = 10.0) -> None:
        for process in reversed(self.processes):
            if process.alive():
                os.killpg(process.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in reversed(self.processes):
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.popen.pid, signal.SIGKILL)
                process.popen.wait(timeout=5)
        self.processes.clear()


def host_address() -> str:
    """The machine's own non-loopback address (pods on a real node reach the host there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # sends nothing: only picks the outgoing interface's address
            return str(probe.getsockname()[0])
        except OSError:  # no route out: the first global address of any interface
            listed = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                                    capture_output=True, text=True, check=False)  # fmt: skip
            found = [line.split()[3].split("/")[0] for line in listed.stdout.splitlines()]
            return found[0] if found else "127.0.0.1"


def _https_ok(url: str, context: ssl.SSLContext) -> bool:
    with urllib.request.urlopen(url, context=context, timeout=5) as response:
        return bool(response.status == 200)


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bool(response.status == 200)


def _insecure_context() -> ssl.SSLContext:
    """For the health endpoints of KCM and scheduler, which serve self-signed certificates."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class LocalControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on loopback."""

    def __init__(self, binaries: Binaries, workdir: Path) -> None:
        self.binaries = binaries
        self.workdir = workdir
        self.group = ProcessGroup(workdir)
        self.pki: Pki | None = None
        self.server = ""
        self.kubeconfig = workdir / "admin.kubeconfig"

    def start(self, timeout: float = 180.0) -> None:
        etcd_client, etcd_peer, apiserver, kcm, scheduler = free_ports(5)
        # Pods on a real node reach the API server at the host's address (kube-proxy's target for the
        # `kubernetes` Service); clients here keep using loopback.
        self.address = host_address()
        self.pki = pki = make_pki(self.workdir / "pki", (self.address,))
        self.server = f"https://127.0.0.1:{apiserver}"

        etcd_url, peer_url = f"http://127.0.0.1:{etcd_client}", f"http://127.0.0.1:{etcd_peer}"
        etcd = self.group.start("etcd", [
            str(self.binaries.etcd), "--name=default", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}", "--unsafe-no-fsync=true", "--log-level=warn",
        ])  # fmt: skip
        self.group.wait_until(etcd, lambda: http_ok(f"{etcd_url}/health"), timeout, "/health")

        self.api_command = [
            str(self.binaries.kube_apiserver), f"--etcd-servers={etcd_url}",
            "--bind-address=0.0.0.0", f"--secure-port={apiserver}", f"--advertise-address={self.address}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.apiserver.cert}", f"--tls-private-key-file={pki.apiserver.key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-issuer={self.server}", f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
            "--allow-privileged=true", "--v=1",
            # logs and exec of a real node's pods: the kubelet at its InternalIP, as a client it trusts
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki.admin.cert}", f"--kubelet-client-key={pki.admin.key}",
            # as on hardened clusters: setting blockOwnerDeletion needs update on the owner's finalizers;
            # a namespace's node selector and default tolerations keep its pods on the real node
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement,PodNodeSelector,PodTolerationRestriction",
        ]  # fmt: skip
        self.admin_context = admin_context = ssl.create_default_context(cafile=str(pki.ca_cert))
        admin_context.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
        self.api = api = self.group.start("kube-apiserver", self.api_command)
        self.group.wait_until(api, lambda: _https_ok(f"{self.server}/readyz", admin_context), timeout, "/readyz")

        self.kubeconfig.write_text(manifests.kubeconfig(self.server, pki.ca_cert, pki.admin.cert, pki.admin.key))
        kcm_config = self.workdir / "kube-controller-manager.kubeconfig"
        kcm_config.write_text(
            manifests.kubeconfig(self.server, pki.ca_cert, pki.controller_manager.cert, pki.controller_manager.key)
        )
        scheduler_config = self.workdir / "kube-scheduler.kubeconfig"
        scheduler_config.write_text(
            manifests.kubeconfig(self.server, pki.ca_cert, pki.scheduler.cert, pki.scheduler.key)
        )
        controller_manager = self.group.start("kube-controller-manager", [
            str(self.binaries.kube_controller_manager), f"--kubeconfig={kcm_config}",
            f"--authentication-kubeconfig={kcm_config}", f"--authorization-kubeconfig={kcm_config}",
            "--bind-address=127.0.0.1", f"--secure-port={kcm}", f"--cert-dir={self.workdir / 'kcm-certs'}",
            "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.sa_key}", f"--root-ca-file={pki.ca_cert}",
            f"--cluster-signing-cert-file={pki.ca_cert}", f"--cluster-signing-key-file={pki.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--controllers=*", "--v=1",
        ])  # fmt: skip
        kube_scheduler = self.group.start("kube-scheduler", [
            str(self.binaries.kube_scheduler), f"--kubeconfig={scheduler_config}",
            f"--authentication-kubeconfig={scheduler_config}",
            f"--authorization-kubeconfig={scheduler_config}",
            "--bind-address=127.0.0.1", f"--secure-port={scheduler}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}", "--leader-elect=false", "--v=1",
        ])  # fmt: skip
        insecure = _insecure_context()
        self.group.wait_until(
            controller_manager,
            lambda: _https_ok(f"https://127.0.0.1:{kcm}/healthz", insecure),
            timeout,
            "/healthz",
        )
        self.group.wait_until(
            kube_scheduler,
            lambda: _https_ok(f"https://127.0.0.1:{scheduler}/healthz", insecure),
            timeout,
            "/healthz",
        )

    def stop_api_server(self) -> None:
        """Kill kube-apiserver outright, as a crash or a node failure would (etcd keeps the state)."""
        os.killpg(self.api.popen.pid, signal.SIGKILL)
        self.api.popen.wait(timeout=30)

    def start_api_server(self, timeout: float = 120.0) -> None:
        """Start kube-apiserver again on the same port, with the same state; wait until it is ready."""
        self.api = self.group.start("kube-apiserver", self.api_command)
        self.group.wait_until(
            self.api, lambda: _https_ok(f"{self.server}/readyz", self.admin_context), timeout, "/readyz"
        )

    def stop(self) -> None:
        self.group.stop()


class Kwok:
    """KWOK, out of cluster, simulating the fake nodes and pod phases of any cluster."""

    def __init__(self, binaries: Binaries, workdir: Path, kubeconfig: Path) -> None:
        self.binaries = binaries
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.group = ProcessGroup(workdir)

    def start(self, timeout: float = 60.0) -> None:
        stages = self.workdir / "stages"
        stages.mkdir(parents=True, exist_ok=True)
        (stages / "pod-complete.yaml").write_text(manifests.JOB_POD_COMPLETE_STAGE)
        (stages / "pod-init-failed.yaml").write_text(manifests.POD_INIT_FAILED_STAGE)
        shipped_pod_ready = (self.binaries.kwok_stages / "pod-ready.yaml").read_text()
        (stages / "pod-ready.yaml").write_text("---\n".join(manifests.probe_aware_pod_stages(shipped_pod_ready)))
        configs = [
            self.binaries.kwok_stages / "node-initialize.yaml",
            self.binaries.kwok_stages / "pod-delete.yaml",
            stages / "pod-ready.yaml",
            stages / "pod-complete.yaml",
            stages / "pod-init-failed.yaml",
        ]
        (port,) = free_ports(1)
        command = [
            str(self.binaries.kwok), f"--kubeconfig={self.kubeconfig}", "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={manifests.KWOK_NODE_ANNOTATION}=fake",
            "--node-lease-duration-seconds=40", f"--cidr={POD_CIDR}", "--node-ip=10.245.0.1",
            f"--server-address=127.0.0.1:{port}",
            *(f"--config={config}" for config in configs),
        ]  # fmt: skip
        # HOME here keeps a developer's ~/.kwok/kwok.yaml from being loaded into the tests.
        kwok = self.group.start("kwok", command, env={"HOME": str(self.workdir), "KWOK_WORKDIR": str(self.workdir)})
        self.group.wait_until(kwok, lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), timeout, "/healthz")

    def stop(self) -> None:
        self.group.stop()


def register_nodes(kubectl: Kubectl, nodes: list[dict[str, Any]], timeout: float = 60.0) -> None:
    """Create the simulated nodes (status on create is kept) and wait until KWOK reports them Ready."""
    kubectl.apply(*nodes)
    names = {n["metadata"]["name"] for n in nodes}

    def all_ready() -> bool:
        items = kubectl.get("nodes")["items"]
        ready = {
            item["metadata"]["name"]
            for item in items
            if any(c["type"] == "Ready" and c["status"] == "True" for c in item["status"].get("conditions", []))
        }
        return names <= ready

    kubectl.wait_for(all_ready, timeout, f"nodes {sorted(names)} Ready")


def wait_default_service_account(kubectl: Kubectl, timeout: float = 60.0) -> None:
    """Pods can be created once the service-account controller has made `default`."""
    kubectl.wait_for(
        lambda: kubectl.run("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
        timeout,
        "the default ServiceAccount",
    )


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Cluster:
    """What tests get: the kubeconfig, a kubectl bound to it, and the pinned binaries (helm...)."""

    kubeconfig: Path
    kubectl: Kubectl
    binaries: Binaries
    control_plane: LocalControlPlane | None = None  # only --cluster=local can stop its API server

    @property
    def env(self) -> dict[str, str]:
        """Environment for subprocesses (helm, the operator) that should talk to this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """The pinned helm run against this cluster; with `check`, a failure raises with helm's own words."""
        result = subprocess.run(
            [str(self.binaries.helm), *args], env=self.env, capture_output=True, text=True, timeout=timeout,
            check=False,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
        return result

    def api_server(self, ca_file: Path) -> str:
        """The API server URL of the current context; its CA certificate is written to `ca_file`."""
        config = json.loads(self.kubectl.run("config", "view", "--raw", "--minify", "-o", "json").stdout)
        cluster = config["clusters"][0]["cluster"]
        ca_file.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        return str(cluster["server"])
