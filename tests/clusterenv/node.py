"""A real node for the test cluster: containerd + runc + CNI bridge + kubelet + kube-proxy + CoreDNS.

Pods scheduled onto it run as real containers from the images `hack/images.sh` built (imported into
containerd; nothing is pulled): probes, init containers, emptyDirs, ConfigMap, Secret and projected
service-account volumes, security contexts, Services (kube-proxy, iptables) and cluster DNS (CoreDNS,
out of cluster, reading the API) are the real implementations. It advertises `nvidia.com/gpu` and
the T4 labels and taint, so the operator's GPU pods schedule onto it (they run on the CPU); a taint of
its own keeps away every pod not of a `node_namespace` namespace.

What this machine kind needs (../shared/reference/containers-recipe.md): runc, not crun; a runc
wrapper that turns the negative `oom_score_adj` containerd and the kubelet ask for into 0 (refused
here); cgroup v1 allowed (`failCgroupV1: false`). Pods reach the API server and the host's services
on the host's address (the control plane listens there too); nothing is routed off the machine.

`stop()` kills the pods' containers, the node's processes, its iptables rules and its bridge.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from clusterenv import manifests
from clusterenv.controlplane import Binaries, ProcessGroup, host_address, http_ok
from clusterenv.kubectl import ClusterError, Kubectl
from clusterenv.pki import Pki
from servinglab.servers.process import free_ports

#: Pod addresses on the real node (apart from KWOK's simulated pods, 10.244.0.0/16).
NODE_POD_CIDR = "10.250.0.0/24"
#: The real node's label and taint: every pod of a namespace made by `node_namespace` lands on it, and no
#: other. Without the taint, a GPU pod still pending in another test's namespace (a T4 server, say) can be
#: bound to it the moment it joins and hold its one GPU: the operator's queue counts that pod, and the
#: real node's experiment waits behind it. The operator reads the namespace's default toleration.
REAL_NODE_KEY = "servinglab.dev/real-node"
#: The real node's name, which its pods' `spec.nodeName` gives
REAL_NODE_NAME = "real-t4"
REAL_NODE_TAINT = {"key": REAL_NODE_KEY, "value": "true", "effect": "NoSchedule"}
BRIDGE = "slcni0"
CLUSTER_DOMAIN = "cluster.local"
SANDBOX_IMAGE = "docker.io/servinglab/pause:1"

RUNC_WRAPPER = """#!/bin/sh
# runc, with a negative oomScoreAdj in the bundle's config.json made 0: this machine refuses
# negative oom_score_adj values, which containerd (sandboxes) and the kubelet (Guaranteed pods) ask for.
prev=""
for arg in "$@"; do
  if [ "$prev" = "--bundle" ] && [ -f "$arg/config.json" ]; then
    sed -i 's/"oomScoreAdj":-[0-9]*/"oomScoreAdj":0/' "$arg/config.json"
  fi
  prev=$arg
done
exec runc "$@"
"""


#: Where earlier versions kept a docker-archive of the images (about 6 GB): removed when found, since the
#: images now go from podman straight into containerd.
OLD_ARCHIVES = Path.home() / ".cache" / "servinglab" / "images"


def image_engine() -> list[str]:
    return ["podman", "--runtime", "runc"] if shutil.which("podman") else ["docker"]


def images_bytes(images: list[str]) -> int:
    """About what `images` take once imported and unpacked: they share their base, so the largest one and a
    little more, twice (the layers in containerd's content store, then unpacked into snapshots)."""
    sizes = subprocess.run([*image_engine(), "image", "inspect", "--format", "{{.Size}}", *images],
                           capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    return 2 * (max(int(size) for size in sizes) + 500_000_000)


def node_namespace(name: str) -> dict[str, Any]:
    """A namespace whose pods all run on the real node (and nowhere else), under the `restricted` Pod
    Security Standard; the API server's PodNodeSelector and PodTolerationRestriction apply it."""
    # the node is a GPU node: its `nvidia.com/gpu` taint must not keep the operator and load pods away
    toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                  {"key": REAL_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}]  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
            "annotations": {"scheduler.alpha.kubernetes.io/node-selector": f"{REAL_NODE_KEY}=true",
                            "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps(toleration)},
        },
    }  # fmt: skip


def cni_config() -> dict[str, Any]:
    return {
        "cniVersion": "0.4.0",
        "name": "servinglab",
        "plugins": [
            {
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": NODE_POD_CIDR}]],
                         "routes": [{"dst": "0.0.0.0/0"}]},
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "loopback"},
        ],
    }  # fmt: skip


def containerd_config(default: str, root: Path, state: Path, cni_dir: Path, runc: Path) -> str:
    """containerd's default configuration with this node's paths, sandbox image and runc wrapper."""
    replacements = {
        'root = "/var/lib/containerd"': f'root = "{root}"',
        'state = "/run/containerd"': f'state = "{state}"',
        'address = "/run/containerd/containerd.sock"': f'address = "{state}/containerd.sock"',
        'sandbox_image = "registry.k8s.io/pause:3.6"': f'sandbox_image = "{SANDBOX_IMAGE}"',
        'bin_dir = "/opt/cni/bin"': 'bin_dir = "/usr/lib/cni"',
        'conf_dir = "/etc/cni/net.d"': f'conf_dir = "{cni_dir}"',
        'BinaryName = ""': f'BinaryName = "{runc}"',
    }
    for old, new in replacements.items():
        if old not in default:
            raise ClusterError(f"containerd's default config has no {old!r}")
        default = default.replace(old, new, 1)
    return default


def kubelet_config(address: str, port: int, healthz: int, socket_path: Path, ca: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address, "port": port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": healthz,
        "containerRuntimeEndpoint": f"unix://{socket_path}",
        "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
        "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": False, "evictionHard": {},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDNS": [address], "clusterDomain": CLUSTER_DOMAIN,
        "registerWithTaints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, REAL_NODE_TAINT],
        "serializeImagePulls": False, "maxPods": 40,
        "syncFrequency": "5s", "fileCheckFrequency": "5s",
    }  # fmt: skip


def corefile(address: str, port: int, kubeconfig: Path, health: int) -> str:
    return (
        f"{CLUSTER_DOMAIN}:{port} {{\n"
        f"    bind {address}\n"
        f"    kubernetes {CLUSTER_DOMAIN} {{\n        kubeconfig {kubeconfig}\n        pods insecure\n    }}\n"
        f"    health 127.0.0.1:{health}\n    cache 5\n}}\n"
        f".:{port} {{\n    bind {address}\n    template ANY ANY {{\n        rcode NXDOMAIN\n    }}\n}}\n"
    )


class RealNode:
    """One real node named `name`, for the pods of the namespaces `node_namespace` makes."""

    def __init__(
        self,
        binaries: Binaries,
        workdir: Path,
        kubectl: Kubectl,
        pki: Pki,
        server: str,
        name: str = REAL_NODE_NAME,
        labels: dict[str, str] | None = None,
        gpus: int = 1,
    ) -> None:
        self.binaries = binaries
        self.workdir = workdir
        self.kubectl = kubectl
        self.pki = pki
        self.server = server
        self.name = name
        self.labels = {**(labels or {}), REAL_NODE_KEY: "true"}
        self.gpus = gpus
        self.address = host_address()
        self.group = ProcessGroup(workdir)
        # unix sockets (containerd's and its shims') must stay short
        self.state = Path(tempfile.mkdtemp(prefix="sl-ctrd-", dir="/run"))
        self.socket = self.state / "containerd.sock"
        self.timings: dict[str, float] = {}

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip

    # -- start -----------------------------------------------------------------------------------

    def start(self, images: list[str], timeout: float = 180) -> None:
        """Start it all, with `images` (the engine's names) in containerd; `timings` says how long each step
        took. Refused at once, saying how much, where the disk cannot hold the images."""
        shutil.rmtree(OLD_ARCHIVES, ignore_errors=True)
        self._check_space(images)
        steps = [
            ("containerd", lambda: self._start_containerd(timeout)),
            ("image import", lambda: self._import(images)),
            ("CoreDNS", lambda: self._start_dns(timeout)),
            ("kubelet until Ready", lambda: self._start_kubelet(timeout)),
            ("kube-proxy", lambda: self._start_kube_proxy(timeout)),
        ]
        for name, step in steps:
            begun = time.monotonic()
            step()
            self.timings[name] = time.monotonic() - begun

    def _check_space(self, images: list[str]) -> None:
        """A pod whose image cannot be unpacked for want of space waits in ContainerCreating, and its
        experiment in Deploying, until a timeout: say it first."""
        needed, free = images_bytes(images), shutil.disk_usage(self.workdir).free
        if free < needed:
            raise ClusterError(f"the real node needs about {needed / 1e9:.1f} GB free in {self.workdir} for its "
                               f"images (imported, then unpacked); {free / 1e9:.1f} GB are")  # fmt: skip

    def _import(self, images: list[str]) -> None:
        """The images straight from the engine into containerd (one archive, shared layers once, never on disk)."""
        engine = image_engine()
        multiple = ["--format", "docker-archive", "-m"] if engine[0] == "podman" else []
        ctr = ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", "images", "import", "--no-unpack", "-"]
        with tempfile.TemporaryFile() as said:
            save = subprocess.Popen([*engine, "save", *multiple, *images], stdout=subprocess.PIPE,
                                    stderr=said)  # fmt: skip
            assert save.stdout is not None
            load: subprocess.Popen[str] | None = None
            try:
                load = subprocess.Popen(ctr, stdin=save.stdout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)  # fmt: skip
                save.stdout.close()  # the import's end only: should it stop reading, the save ends too
                output, _ = load.communicate(timeout=900)
                saved = save.wait(timeout=60)
            finally:
                for process in (save, load):
                    if process is not None and process.poll() is None:
                        process.kill()
                        process.wait()
            said.seek(0)
            if saved != 0 or load.returncode != 0:
                raise ClusterError(
                    f"importing {' '.join(images)} into containerd failed: the save ended {saved} "
                    f"({said.read().decode(errors='replace')[-1000:].strip()}), the import {load.returncode} "
                    f"({output[-1000:].strip()})"
                )

    def _start_containerd(self, timeout: float) -> None:
        root = self.workdir / "containerd"
        cni_dir = self.workdir / "cni"
        cni_dir.mkdir(parents=True)
        (cni_dir / "10-servinglab.conflist").write_text(json.dumps(cni_config()))
        runc = self.workdir / "runc-wrapper"
        runc.write_text(RUNC_WRAPPER)
        runc.chmod(0o755)
        default = subprocess.run(["containerd", "config", "default"], capture_output=True, text=True, check=True)
        config = self.workdir / "containerd.toml"
        config.write_text(containerd_config(default.stdout, root, self.state, cni_dir, runc))
        containerd = self.group.start("containerd", ["containerd", "--config", str(config)])
        self.group.wait_until(
            containerd, lambda: self.ctr("version", timeout=10).returncode == 0, timeout, "its socket"
        )

    def _start_dns(self, timeout: float) -> None:
        """CoreDNS on the host's address, port 53: the kubelet gives pods one nameserver, without a port."""
        (health,) = free_ports(1)
        kubeconfig = self._kubeconfig("coredns", "system:coredns-test", "system:masters")
        core = self.workdir / "Corefile"
        core.write_text(corefile(self.address, 53, kubeconfig, health))
        dns = self.group.start("coredns", [str(self.binaries.coredns), "-conf", str(core)])
        self.group.wait_until(dns, lambda: http_ok(f"http://127.0.0.1:{health}/health"), timeout, "/health")

    def _kubeconfig(self, file: str, user: str, group: str) -> Path:
        """A kubeconfig with a client certificate of its own: the kubelet is `system:node:<name>` (the
        Node authorizer's rules), kube-proxy `system:kube-proxy` (bound to system:node-proxier)."""
        cert = self.pki.client(file, user, group)
        path = self.workdir / f"{file}.kubeconfig"
        path.write_text(manifests.kubeconfig(self.server, self.pki.ca_cert, cert.cert, cert.key))
        return path

    def _start_kubelet(self, timeout: float) -> None:
        port, healthz = free_ports(2)
        config = self.workdir / "kubelet.yaml"
        config.write_text(json.dumps(kubelet_config(self.address, port, healthz, self.socket, self.pki.ca_cert)))
        kubeconfig = self._kubeconfig("kubelet", f"system:node:{self.name}", "system:nodes")
        labels = ",".join(f"{key}={value}" for key, value in self.labels.items())
        kubelet = self.group.start("kubelet", [
            str(self.binaries.kubelet), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={self.name}", f"--node-ip={self.address}",
            f"--root-dir={self.workdir / 'kubelet'}", f"--cert-dir={self.workdir / 'kubelet-pki'}",
            *([f"--node-labels={labels}"] if labels else []), "--v=1",
        ])  # fmt: skip
        self.group.wait_until(kubelet, self._ready, timeout, f"node {self.name} Ready")
        # an extended resource, as a device plugin would advertise it (the kubelet keeps it)
        patch = {"status": {"capacity": {"nvidia.com/gpu": str(self.gpus)}}}
        self.kubectl.run("patch", "node", self.name, "--subresource=status", "--type=merge", "-p", json.dumps(patch))
        self.group.wait_until(kubelet, self._gpus_allocatable, timeout, f"nvidia.com/gpu on {self.name}")

    def _node(self) -> dict[str, Any] | None:
        found = self.kubectl.run("get", "node", self.name, "-o", "json", check=False)
        return json.loads(found.stdout) if found.returncode == 0 else None

    def _ready(self) -> bool:
        node = self._node()
        conditions = (node or {}).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _gpus_allocatable(self) -> bool:
        node = self._node()
        return (node or {}).get("status", {}).get("allocatable", {}).get("nvidia.com/gpu") == str(self.gpus)

    def _start_kube_proxy(self, timeout: float) -> None:
        metrics, healthz = free_ports(2)
        kubeconfig = self._kubeconfig("kube-proxy", "system:kube-proxy", "system:node-proxier")
        proxy = self.group.start("kube-proxy", [
            str(self.binaries.kube_proxy), f"--kubeconfig={kubeconfig}", f"--hostname-override={self.name}",
            "--proxy-mode=iptables", f"--cluster-cidr={NODE_POD_CIDR}",
            f"--metrics-bind-address=127.0.0.1:{metrics}", f"--healthz-bind-address=127.0.0.1:{healthz}",
            "--conntrack-max-per-core=0", "--v=1",
        ])  # fmt: skip
        self.group.wait_until(proxy, lambda: http_ok(f"http://127.0.0.1:{healthz}/healthz"), timeout, "/healthz")

    # -- stop ------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Pods' containers first (their shims outlive containerd), then the node's processes and rules."""
        listed = self.ctr("tasks", "ls", "-q", timeout=30)
        for task in listed.stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, timeout=30)
        time.sleep(1)
        self.group.stop()
        subprocess.run([str(self.binaries.kube_proxy), "--cleanup"], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
        for mount in reversed(Path("/proc/mounts").read_text().splitlines()):
            target = mount.split()[1]
            if target.startswith((str(self.workdir), str(self.state))):
                subprocess.run(["umount", "-l", target], capture_output=True, check=False)
        shutil.rmtree(self.state, ignore_errors=True)
        # the imported and unpacked images (about 12 GB), which pytest's kept temp folders would pile up
        for kept in ("containerd", "kubelet"):
            shutil.rmtree(self.workdir / kept, ignore_errors=True)
