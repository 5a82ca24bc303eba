"""A stand-in kubelet for servinglab's pods: runs their containers as local processes.

KWOK moves pods through their phases but runs nothing. For end-to-end tests this harness watches
one namespace and, for servinglab's pods (by `app.kubernetes.io/component`: the Helm chart's
`operator` and its `test` hook, the operator's `server` and `load`), does what a kubelet would with
the very specs stored in the API: mounts the ConfigMaps (as files, `binaryData` too) and
PersistentVolumeClaims (as folders), runs the init container's script (a failure is reported as a
kubelet would: the pod back to Pending, the init container's last termination with its exit code
and message), starts the container's command with its args and env, runs its readiness probe (HTTP
or exec), and reports back through the API — readiness via the `kwok.servinglab.dev/ready`
annotation, a Job container's exit code and termination message via the completion annotations
KWOK turns into pod status, a server container that ended as a terminated container status.

Pods that cannot start are reported as a kubelet reports them, in the pod's status (which KWOK then
leaves alone: :data:`manifests.KUBELET_STATUS_ANNOTATION`): an image reference that does not parse
(InvalidImageName), an image on a registry that cannot exist (a `.invalid` host, RFC 2606: ErrImagePull),
an env variable from a Secret or key that is missing (CreateContainerConfigError), a ConfigMap volume
that is missing (the pod stays ContainerCreating). A test can also evict the server (`evict_server`) or
have it killed for memory (`oom_kill_server`).

Container paths are mapped into a per-pod folder, container ports onto free loopback ports (listen
addresses and port numbers in args and env follow), and Service DNS names (`http://<service>:<port>`)
onto the ports of the pods the Service selects. The simulated GPU nodes' GPUs are not on this machine:
a server's own configuration is told so (TorchServe's `number_of_gpu=0`, LitServe's script on the CPU);
that is all that is translated. The operator and the load Job run with a real token of their
ServiceAccount, so their RBAC is exercised too.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterenv import manifests
from clusterenv.cadvisor import CAdvisor
from clusterenv.kubectl import Kubectl
from servinglab.servers.process import free_ports
from servinglab.servers.triton import env as triton_environment

VENV_BIN = Path(sys.executable).parent


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class PodNotStartable(Exception):
    """Not yet: the pod needs another pod that is not running yet."""


# an image reference: [host[:port]/]path[:tag][@digest], the path lowercase (as the runtime parses it)
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*(?::\w[\w.-]{{0,127}})?(?:@sha256:[a-f0-9]{{64}})?$"
)


@dataclass(frozen=True)
class CannotStart:
    """Why a container of a pod cannot start, as its waiting state says."""

    container: str
    init: bool
    reason: str
    message: str


@dataclass
class RunningPod:
    name: str
    root: Path
    labels: dict[str, str] = field(default_factory=dict)
    named_ports: dict[str, int] = field(default_factory=dict)  # port name -> container port
    ports: dict[int, int] = field(default_factory=dict)  # container port -> local port
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    log: Path | None = None  # output of the last process started
    ready: bool = False
    done: bool = False
    init_seconds: float = 0.0  # how long the init containers ran
    mounts: dict[str, Path] = field(default_factory=dict)  # the container's mount paths -> local folders
    dns: str = ""  # `<hostname>.<subdomain>` when the pod has both (the pods of an indexed Job)
    container: dict[str, Any] = field(default_factory=dict)  # the (first) container's spec
    containers: dict[str, int] = field(default_factory=dict)  # each container's (not init's) main process id


class LocalKubelet:
    """Runs the server and load pods of a namespace locally until stopped."""

    def __init__(
        self,
        kubectl: Kubectl,
        namespace: str,
        workdir: Path,
        api_server: str,
        ca_cert: Path,
        on_server_started: Callable[[str, int], None] | None = None,
        job_outcome: tuple[int, str] | None = None,
        on_operator_started: Callable[[str, int], None] | None = None,
        claims_root: Path | None = None,
        job_command: list[str] | None = None,
    ) -> None:
        """`on_server_started(pod, metrics_port)` and `on_operator_started(pod, metrics_port)` let
        monitoring scrape them; `job_outcome` (exit code, message) replaces the real load run, to play
        a Job that dies (e.g. OOMKilled); `job_command` replaces the load container's command and args
        (its env, mounts and ServiceAccount stay), to play a load Job that writes chosen results (both
        may be changed between experiments). A PersistentVolumeClaim mounts the folder
        `claims_root/<claim name>` (default: `workdir/claims`)."""
        self.claims_root = claims_root or workdir / "claims"
        self.on_server_started = on_server_started
        self.on_operator_started = on_operator_started
        self.job_outcome = job_outcome
        self.job_command = job_command
        self.kubectl = kubectl
        self.namespace = namespace
        self.workdir = workdir
        self.api_server = api_server
        self.ca_cert = ca_cert
        self.pods: dict[str, RunningPod] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        # held while a server's end is decided: by the watch loop, which reports a server that exited on its
        # own, or by a fault played here (a kill, an eviction, an OOM kill), which reports it after; one end a pod
        self._ending = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="local-kubelet", daemon=True)
        self.cadvisor = CAdvisor(namespace, self._running_containers)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> LocalKubelet:
        self.cadvisor.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.cadvisor.stop()
        for pod in list(self.pods.values()):
            self._kill(pod)

    def kill_server(self) -> None:
        """Crash the server: kill its processes and report the container terminated, as a kubelet would."""
        for pod in self._running_servers():
            self._end_for_fault(pod)
            self._report_server_terminated(pod, 137, "Error", "killed")

    def evict_server(self, name: str, message: str = "The node was low on resource: memory.") -> None:
        """Evict the server pod `name` as a kubelet under node pressure does: its containers stopped, the pod
        Failed with reason Evicted (its ReplicaSet then makes another)."""
        (pod,) = [pod for pod in self._running_servers() if pod.name == name]
        self._end_for_fault(pod)
        terminated = {"exitCode": 137, "reason": "Error", "message": "evicted"}
        self._patch_status(pod.name, {
            "phase": "Failed", "reason": "Evicted", "message": message,
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "DisruptionTarget", "status": "True",
                            "reason": "TerminationByKubelet", "message": message}],
            "containerStatuses": [{"name": "torchserve", "image": "pytorch/torchserve:0.12.0-gpu", "ready": False,
                                   "restartCount": 0, "state": {"terminated": terminated}}],
        })  # fmt: skip

    def oom_kill_server(self, name: str) -> None:
        """The kernel kills the server container of pod `name` for its memory: the kubelet restarts it and
        reports the kill as the container's last state (OOMKilled, exit code 137)."""
        (pod,) = [pod for pod in self._running_servers() if pod.name == name]
        self._end_for_fault(pod)
        killed = {"exitCode": 137, "reason": "OOMKilled", "startedAt": _now(), "finishedAt": _now()}
        self._patch_status(pod.name, {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "ContainersReady", "status": "False"}],
            "containerStatuses": [{"name": "torchserve", "image": "pytorch/torchserve:0.12.0-gpu", "ready": False,
                                   "restartCount": 1, "lastState": {"terminated": killed},
                                   "state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
        })  # fmt: skip

    def _end_for_fault(self, pod: RunningPod) -> None:
        """Stop a server whose end a fault reports: marked ended before its processes die. Killed first, the
        watch loop could see them gone and report a plain exit of its own, before or over the fault's report
        (an eviction or OOM kill the operator never sees)."""
        with self._ending:
            if pod.done:  # the loop saw it exit on its own first, and said so
                raise RuntimeError(f"server pod {pod.name} ended on its own before the fault could be played")
            pod.done = True
        self._kill(pod)

    def _running_containers(self) -> dict[tuple[str, str], int]:
        """(pod, container) -> main process id, of the containers running now: what the stand-in cAdvisor counts."""
        return {(pod.name, name): pid for pod in list(self.pods.values()) if not pod.done
                for name, pid in list(pod.containers.items())}  # fmt: skip

    def _running_servers(self) -> list[RunningPod]:
        return [pod for pod in list(self.pods.values()) if pod.ports and not pod.done
                and pod.labels.get("app.kubernetes.io/component") == "server"]  # fmt: skip

    def _patch_status(self, pod: str, status: dict[str, Any]) -> None:
        """Write the pod's status as its kubelet; marked first, so that KWOK's stages no longer touch it."""
        self._annotate(pod, {manifests.KUBELET_STATUS_ANNOTATION: "true"})
        self.kubectl.run(
            "patch", "pod", pod, "-n", self.namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip

    def _report_server_terminated(self, pod: RunningPod, code: int, reason: str, message: str) -> None:
        """The server container's end, in the pod's status (KWOK's stages leave a Failed pod alone)."""
        terminated = {"exitCode": code, "reason": reason, "message": message}
        name = pod.container.get("name", "server")
        status = {
            "status": {
                "phase": "Failed",
                "message": f"container {name} exited",
                "containerStatuses": [
                    {
                        "name": name,
                        "image": pod.container.get("image", ""),
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": terminated},
                    }
                ],
            }
        }
        self.kubectl.run(
            "patch", "pod", pod.name, "-n", self.namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps(status),
        )  # fmt: skip

    @staticmethod
    def _kill(pod: RunningPod) -> None:
        for process in pod.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout=15)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(process.pid, signal.SIGKILL)

    # -- the watch loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as exc:
                self.errors.append(repr(exc))
            self._stop.wait(0.5)

    def _sync(self) -> None:
        pods = self.kubectl.read(f"/api/v1/namespaces/{self.namespace}/pods")["items"]  # twice a second: in-process
        # a deleted pod's containers stop (a rollout replaces the chart's operator, cleanup the server)
        present = {pod["metadata"]["name"] for pod in pods if not pod["metadata"].get("deletionTimestamp")}
        for name, running in self.pods.items():
            if name not in present and not running.done:
                self._kill(running)
                running.done = True
        for pod in pods:
            name = pod["metadata"]["name"]
            component = pod["metadata"].get("labels", {}).get("app.kubernetes.io/component")
            if pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
                continue
            starters = {
                "server": self._start_server,
                "load": self._start_job,
                "operator": self._start_operator,
                "test": self._start_check,
            }
            if name not in self.pods and component in starters:
                # a short root: TorchServe puts unix sockets under the pod's /tmp (108-byte limit)
                running = RunningPod(name, Path(tempfile.mkdtemp(prefix="kl-", dir=self.workdir)))
                running.labels = pod["metadata"].get("labels", {})
                container = running.container = pod["spec"]["containers"][0]
                running.named_ports = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
                if component in ("server", "load") and (problem := self._cannot_start(pod)) is not None:
                    self._report_waiting(pod, problem)
                    running.done = True
                    self.pods[name] = running
                    continue
                try:
                    starters[component](pod, running)
                except PodNotStartable:
                    shutil.rmtree(running.root, ignore_errors=True)
                    continue
                except Exception:
                    self._kill(running)  # half started (the API server refused a step): start over next sync
                    raise
                self.pods[name] = running
            running = self.pods.get(name)
            if running is None or running.done:
                continue
            if component in ("server", "operator") and not running.ready and self._probe(pod, running):
                # marked only once reported: a report refused (the API server restarting) is retried next sync
                self.kubectl.run(
                    "annotate", "pod", name, "-n", self.namespace, f"{manifests.READY_ANNOTATION}=true", "--overwrite"
                )
                running.ready = True
            if component in ("load", "test"):
                self._finish_job_if_exited(running)
            if component == "server":
                self._report_server_if_exited(running)

    # -- pods that cannot start -------------------------------------------------------------------

    def _cannot_start(self, pod: dict[str, Any]) -> CannotStart | None:
        """The first container, in the order a kubelet starts them, whose image cannot be pulled or whose
        Secret is missing; or a ConfigMap volume that is missing (before any container starts)."""
        spec = pod["spec"]
        for volume in spec.get("volumes", []):
            config_map = volume.get("configMap")
            if config_map and not config_map.get("optional") and self._get("configmap", config_map["name"]) is None:
                return CannotStart(spec["containers"][0]["name"], False, "ContainerCreating", "")
        for init, container in [*((True, c) for c in spec.get("initContainers", [])),
                                *((False, c) for c in spec["containers"])]:  # fmt: skip
            image = container["image"]
            if not _REFERENCE.match(image):
                message = f'Failed to apply default image tag "{image}": couldn\'t parse image name: invalid reference'
                return CannotStart(container["name"], init, "InvalidImageName", message)
            host = image.split("/", 1)[0] if "/" in image else ""
            if host.split(":")[0].endswith(".invalid"):
                message = f'failed to pull image "{image}": dial tcp: lookup {host}: no such host'
                return CannotStart(container["name"], init, "ErrImagePull", message)
            for variable in container.get("env", []):
                reference = variable.get("valueFrom", {}).get("secretKeyRef")
                if reference is None:
                    continue
                secret = self._get("secret", reference["name"])
                if secret is None:
                    return CannotStart(container["name"], init, "CreateContainerConfigError",
                                       f'secret "{reference["name"]}" not found')  # fmt: skip
                if reference["key"] not in (secret.get("data") or {}):
                    return CannotStart(container["name"], init, "CreateContainerConfigError",
                                       f"couldn't find key {reference['key']} in Secret {self.namespace}/"
                                       f"{reference['name']}")  # fmt: skip
        return None

    def _get(self, kind: str, name: str) -> dict[str, Any] | None:
        found = self.kubectl.run("get", kind, name, "-n", self.namespace, "-o", "json", check=False)
        return json.loads(found.stdout) if found.returncode == 0 else None

    def _report_waiting(self, pod: dict[str, Any], problem: CannotStart) -> None:
        """The pod Pending, its containers waiting: the one that cannot start with its reason, the init
        containers before it done, the others waiting to initialise."""
        spec, started = pod["spec"], _now()
        inits = [c["name"] for c in spec.get("initContainers", [])]
        reached = inits.index(problem.container) if problem.init else len(inits)

        def status(container: dict[str, Any], index: int, init: bool) -> dict[str, Any]:
            state: dict[str, Any]
            if container["name"] == problem.container and init == problem.init:
                said = {"message": problem.message} if problem.message else {}
                state = {"waiting": {"reason": problem.reason, **said}}
            elif init and index < reached:
                state = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started,
                                        "finishedAt": started}}  # fmt: skip
            else:
                state = {"waiting": {"reason": "PodInitializing"}}
            return {"name": container["name"], "image": container["image"], "ready": False, "restartCount": 0,
                    "state": state}  # fmt: skip

        self._patch_status(pod["metadata"]["name"], {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"},
                           {"type": "Initialized", "status": "False" if problem.init else "True"},
                           {"type": "Ready", "status": "False"}, {"type": "ContainersReady", "status": "False"}],
            "initContainerStatuses": [status(c, i, True) for i, c in enumerate(spec.get("initContainers", []))],
            "containerStatuses": [status(c, 0, False) for c in spec["containers"]],
        })  # fmt: skip

    # -- translation -----------------------------------------------------------------------------

    def _mounts(self, pod: dict[str, Any], container: dict[str, Any], root: Path) -> dict[str, Path]:
        """Container mount path -> local folder, with ConfigMap volumes written out as files."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        mapping: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            local = root / "v" / mount["name"]
            volume = volumes[mount["name"]]
            if "persistentVolumeClaim" in volume:  # a claim is a folder shared by every pod that mounts it
                mapping[mount["mountPath"]] = self.claims_root / volume["persistentVolumeClaim"]["claimName"]
                continue
            if "configMap" in volume and not local.exists():
                stored = self.kubectl.get("configmap", volume["configMap"]["name"], "-n", self.namespace)
                data = {key: value.encode() for key, value in stored.get("data", {}).items()}
                data.update({key: base64.b64decode(value) for key, value in stored.get("binaryData", {}).items()})
                items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
                local.mkdir(parents=True)
                for item in items:
                    (local / item["path"]).write_bytes(data[item["key"]])
            local.mkdir(parents=True, exist_ok=True)
            mapping[mount["mountPath"]] = local
        return mapping

    @staticmethod
    def _translate(text: str, mounts: dict[str, Path], urls: dict[str, str]) -> str:
        """Replace mount paths (longest first, one pass: local paths are never rewritten again)
        and service URLs."""
        replacements = {**{path: str(local) for path, local in mounts.items()}, **urls}
        if not replacements:
            return text
        pattern = "|".join(re.escape(key) for key in sorted(replacements, key=len, reverse=True))
        return re.sub(pattern, lambda match: replacements[match.group(0)], text)

    def _env(
        self,
        container: dict[str, Any],
        mounts: dict[str, Path],
        extra: dict[str, str],
        pod: dict[str, Any] | None = None,
    ) -> dict[str, str]:
        env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", **extra}
        metadata = (pod or {}).get("metadata", {})
        for variable in container.get("env", []):
            field_path = variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
            if "value" in variable:
                env[variable["name"]] = self._translate(variable["value"], mounts, {})
            elif field_path == "metadata.namespace":
                env[variable["name"]] = self.namespace
            elif key := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", field_path):  # e.g. a Job's index
                env[variable["name"]] = metadata.get(key.group(1), {}).get(key.group(2), "")
            elif reference := variable.get("valueFrom", {}).get("secretKeyRef"):
                secret = self.kubectl.get("secret", reference["name"], "-n", self.namespace)
                env[variable["name"]] = base64.b64decode(secret["data"][reference["key"]]).decode()
        return env

    def _spawn(
        self, running: RunningPod, name: str, command: list[str], env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        log = running.root / f"{name}.log"
        (running.root / f"{name}.command").write_text(json.dumps(command))
        with log.open("ab") as handle:
            process = subprocess.Popen(
                command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=running.root, start_new_session=True,
            )  # fmt: skip
        running.processes.append(process)
        if not name.startswith("init-"):
            running.containers[name] = process.pid
        running.log = log
        return process

    def _command(self, container: dict[str, Any], mounts: dict[str, Path], urls: dict[str, str]) -> list[str]:
        """The container's command and args, translated; its program is the one in this venv, if there is
        one by that name (`sh` is the system's)."""
        command = [self._translate(part, mounts, urls) for part in [*container["command"], *container.get("args", [])]]
        if (VENV_BIN / command[0]).exists():
            command[0] = str(VENV_BIN / command[0])
        return command

    def _service_urls(self) -> dict[str, str]:
        """`http://<service>:<port>` -> the local address of the port it targets on a selected pod."""
        urls = {}
        for service in self.kubectl.get("services", "-n", self.namespace)["items"]:
            selector = service["spec"].get("selector") or {}
            targets = [
                pod
                for pod in self.pods.values()
                if pod.ports and not pod.done and selector.items() <= pod.labels.items()
            ]
            if not selector or not targets:
                continue
            for port in service["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                remote = targets[0].named_ports.get(target, target) if isinstance(target, str) else target
                if remote in targets[0].ports:
                    urls[f"http://{service['metadata']['name']}:{port['port']}"] = (
                        f"http://127.0.0.1:{targets[0].ports[remote]}"
                    )
        return urls

    def _pod_addresses(self) -> dict[str, str]:
        """`<hostname>.<subdomain>:<port>` of running pods -> the local address of that port."""
        return {
            f"{pod.dns}:{remote}": f"127.0.0.1:{local}"
            for pod in self.pods.values()
            if pod.dns and not pod.done
            for remote, local in pod.ports.items()
        }

    def _token(self, pod: dict[str, Any]) -> str:
        """A real token of the pod's ServiceAccount, as the kubelet would project it."""
        account = pod["spec"].get("serviceAccountName", "default")
        return self.kubectl.run("create", "token", account, "-n", self.namespace).stdout.strip()

    # -- the server pod --------------------------------------------------------------------------

    def _start_server(self, pod: dict[str, Any], running: RunningPod) -> None:
        running.root.mkdir(parents=True, exist_ok=True)
        spec = pod["spec"]
        for init in spec.get("initContainers", []):
            mounts = self._mounts(pod, init, running.root)
            self._instances_on_cpu(mounts)
            termination = running.root / f"init-{init['name']}.termination-log"
            mounts_and_log = {**mounts, "/dev/termination-log": termination}
            script = [self._translate(part, mounts_and_log, {}) for part in [*init["command"], *init.get("args", [])]]
            begun = time.monotonic()
            init_process = self._spawn(running, f"init-{init['name']}", script, self._env(init, mounts, {}))
            code = init_process.wait(timeout=300)
            running.init_seconds += time.monotonic() - begun
            message = termination.read_text() if termination.exists() else ""
            if code != 0:  # reported as a kubelet would; the pod is not started (nor retried here)
                message = message or (running.log.read_text(errors="replace")[-400:] if running.log else "")
                self._annotate(running.name, {manifests.INIT_EXIT_CODE_ANNOTATION: str(code),
                                              manifests.INIT_MESSAGE_ANNOTATION: message})  # fmt: skip
                running.done = True
                return
            if message:  # each init container's own message, as a kubelet reports it (and the last, for all)
                self._annotate(running.name, {manifests.INIT_MESSAGE_ANNOTATION: message,
                                              manifests.init_message_annotation(init["name"]): message})  # fmt: skip
        container = spec["containers"][0]
        mounts = running.mounts = self._mounts(pod, container, running.root)
        if "/etc/torchserve" in mounts:
            command, env = self._torchserve(container, running, mounts)
        elif "/etc/litserve" in mounts:
            command, env = self._litserve(container, running, mounts)
        else:
            command, env = self._triton(container, running, mounts)
        self._spawn(running, container["name"], command, env)
        if self.on_server_started is not None:
            self.on_server_started(running.name, running.ports[running.named_ports["metrics"]])

    def _torchserve(
        self, container: dict[str, Any], running: RunningPod, mounts: dict[str, Path]
    ) -> tuple[list[str], dict[str, str]]:
        # TorchServe's management and gRPC ports are named in its config only
        ports = [p["containerPort"] for p in container.get("ports", [])] + [8081, 7070, 7071]
        running.ports = dict(zip(ports, free_ports(len(ports)), strict=True))
        self._local_torchserve_config(mounts, running.ports)
        env = self._env(container, mounts, {"TMPDIR": str(mounts["/tmp"])})
        command = self._command(container, {**mounts, "/dev/termination-log": running.root / "termination-log"}, {})
        return command, env

    def _litserve(
        self, container: dict[str, Any], running: RunningPod, mounts: dict[str, Path]
    ) -> tuple[list[str], dict[str, str]]:
        """LitServe's rendered script, on the CPU (the simulated node's GPU is not here), its listen
        addresses made local."""
        ports = [p["containerPort"] for p in container.get("ports", [])]
        running.ports = dict(zip(ports, free_ports(len(ports)), strict=True))
        script = mounts["/etc/litserve"] / "server.py"
        script.write_text(script.read_text().replace("accelerator='cuda'", "accelerator='cpu'"))
        env = self._env(container, mounts, {"TMPDIR": str(mounts["/tmp"])})
        listen = {f"0.0.0.0:{remote}": f"127.0.0.1:{local}" for remote, local in running.ports.items()}
        mounts_and_log = {**mounts, "/dev/termination-log": running.root / "termination-log"}
        return self._command(container, mounts_and_log, listen), env

    def _local_torchserve_config(self, mounts: dict[str, Path], ports: dict[int, int]) -> None:
        """TorchServe's config.properties as the ConfigMap has it, with listen addresses made local."""
        properties = mounts["/etc/torchserve"] / "config.properties"
        text = self._translate(properties.read_text(), mounts, {})
        for remote, local in ports.items():
            text = re.sub(rf"(//[0-9.]+):{remote}\b", rf"\g<1>:{local}", text)
            text = re.sub(rf"^(grpc_\w+_port)={remote}$", rf"\g<1>={local}", text, flags=re.MULTILINE)
        text = text.replace("0.0.0.0", "127.0.0.1")
        # the simulated node's GPU is not on this machine
        text = re.sub(r"^number_of_gpu=.*$", "number_of_gpu=0", text, flags=re.MULTILINE)
        properties.write_text(text)

    def _triton(
        self, container: dict[str, Any], running: RunningPod, mounts: dict[str, Path]
    ) -> tuple[list[str], dict[str, str]]:
        """tritonserver from the Triton environment (the image's, here the cached one: its launcher on PATH),
        its ports given as options made local and bound to loopback; the simulated node's GPU is not here."""
        ports = [p["containerPort"] for p in container.get("ports", [])]
        running.ports = dict(zip(ports, free_ports(len(ports)), strict=True))
        command = self._command(container, {**mounts, "/dev/termination-log": running.root / "termination-log"}, {})
        for index, part in enumerate(command):
            if option := re.fullmatch(r"(--(?:http|metrics)-port)=(\d+)", part):
                command[index] = f"{option.group(1)}={running.ports[int(option.group(2))]}"
        command += ["--http-address=127.0.0.1", "--metrics-address=127.0.0.1", "--allow-gpu-metrics=false",
                    f"--backend-config=python,shm-region-prefix-name=kl{running.ports[ports[0]]}_"]  # fmt: skip
        launcher = triton_environment.find_env().launcher
        env = self._env(container, mounts, {"TMPDIR": str(mounts["/tmp"])})
        env["PATH"] = f"{launcher.parent}{os.pathsep}{env['PATH']}"
        return command, env

    @staticmethod
    def _instances_on_cpu(mounts: dict[str, Path]) -> None:
        """The simulated node's GPU is not on this machine: a Triton config.pbtxt's GPU instances run on the CPU."""
        for folder in mounts.values():
            config = folder / "config.pbtxt"
            if config.is_file():
                text = re.sub(r"kind: KIND_GPU, gpus: \[[0-9]+\]", "kind: KIND_CPU", config.read_text())
                config.write_text(text)

    def _report_server_if_exited(self, running: RunningPod) -> None:
        """A server container that ended on its own (e.g. it gave up on its model), with its message."""
        with self._ending:
            code = running.processes[-1].poll() if running.processes and not running.done else None
            if code is None:
                return
            log = running.root / "termination-log"
            message = log.read_text() if log.exists() else ""
            self._report_server_terminated(running, code, "Error" if code else "Completed", message)
            running.done = True
        self._kill(running)

    def _annotate(self, pod: str, annotations: dict[str, str]) -> None:
        pairs = [f"{key}={value}" for key, value in annotations.items()]
        self.kubectl.run("annotate", "pod", pod, "-n", self.namespace, *pairs, "--overwrite")

    def _probe(self, pod: dict[str, Any], running: RunningPod) -> bool:
        readiness = pod["spec"]["containers"][0].get("readinessProbe", {})
        if "exec" in readiness:  # run in the container's file system (its mounts)
            command = [self._translate(part, running.mounts, {}) for part in readiness["exec"]["command"]]
            return subprocess.run(command, cwd=running.root, capture_output=True, check=False).returncode == 0
        probe = readiness.get("httpGet")
        if not probe:
            return True
        port = running.ports[running.named_ports.get(probe["port"], probe["port"])]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{probe['path']}", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    # -- the load Job's pod ------------------------------------------------------------------------

    def _start_job(self, pod: dict[str, Any], running: RunningPod) -> None:
        """A Job's pod; an indexed Job's pods find each other by `<hostname>.<subdomain>:<port>`, so a pod
        naming one that is not running yet is not started (tried again next sync)."""
        container = pod["spec"]["containers"][0]
        remote_ports = [p["containerPort"] for p in container.get("ports", [])]
        running.ports = dict(zip(remote_ports, free_ports(len(remote_ports)), strict=True))
        if pod["spec"].get("hostname") and pod["spec"].get("subdomain"):
            running.dns = f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}"
        urls = {**self._service_urls(), **self._pod_addresses()}
        urls.update({f"0.0.0.0:{remote}": f"127.0.0.1:{local}" for remote, local in running.ports.items()})
        for part in container.get("args", []):
            for name in re.findall(r"\b([a-z][a-z0-9-]*-\d+\.[a-z][a-z0-9-]*):\d+", part):
                if not any(address.startswith(f"{name}:") for address in urls) and name != running.dns:
                    raise PodNotStartable(f"{running.name} names {name}, not running yet")
        running.root.mkdir(parents=True, exist_ok=True)
        mounts = self._mounts(pod, container, running.root)
        credentials = running.root / "serviceaccount"
        credentials.mkdir()
        (credentials / "token").write_text(self._token(pod))
        (credentials / "namespace").write_text(self.namespace)
        shutil.copy(self.ca_cert, credentials / "ca.crt")
        host, port = self.api_server.removeprefix("https://").rsplit(":", 1)
        env = self._env(
            container,
            mounts,
            {
                "SERVINGLAB_SERVICEACCOUNT_DIR": str(credentials),
                "KUBERNETES_SERVICE_HOST": host,
                "KUBERNETES_SERVICE_PORT": port,
            },
            pod,
        )
        command = self._command(container, mounts, urls)
        command += ["--termination-log", str(running.root / "termination-log")]
        if self.job_command is not None:
            command = list(self.job_command)
        if self.job_outcome is not None:
            code, message = self.job_outcome
            (running.root / "termination-log").write_text(message)
            command = ["sh", "-c", f"exit {code}"]
        self._spawn(running, container["name"], command, env)

    def _finish_job_if_exited(self, running: RunningPod) -> None:
        process = running.processes[-1]
        code = process.poll()
        if code is None:
            return
        log = running.root / "termination-log"
        message = log.read_text() if log.exists() else ""
        if not message and code != 0 and running.log is not None:  # FallbackToLogsOnError
            message = running.log.read_text(errors="replace")[-400:]
        self.kubectl.run(
            "annotate", "pod", running.name, "-n", self.namespace,
            f"{manifests.EXIT_CODE_ANNOTATION}={code}", f"{manifests.MESSAGE_ANNOTATION}={message}",
            "--overwrite",
        )  # fmt: skip
        running.done = True  # only once reported (see the readiness report)

    # -- the Helm chart's operator pod and its test hook -------------------------------------------

    def _start_operator(self, pod: dict[str, Any], running: RunningPod) -> None:
        """`servinglab operator` from the chart's pod spec, as the chart's ServiceAccount."""
        running.root.mkdir(parents=True, exist_ok=True)
        container = pod["spec"]["containers"][0]
        mounts = self._mounts(pod, container, running.root)
        remote_ports = list(running.named_ports.values())
        running.ports = dict(zip(remote_ports, free_ports(len(remote_ports)), strict=True))
        ca_cert = running.root / "ca.crt"
        shutil.copy(self.ca_cert, ca_cert)
        kubeconfig = running.root / "kubeconfig"
        server = {"server": self.api_server, "certificate-authority": str(ca_cert)}
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "pod",
            "clusters": [{"name": "cluster", "cluster": server}],
            "users": [{"name": "serviceaccount", "user": {"token": self._token(pod)}}],
            "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": "serviceaccount"}}],
        }))  # fmt: skip
        env = self._env(container, mounts, {"KUBECONFIG": str(kubeconfig)})
        for variable in container.get("env", []):  # ports given as numbers (e.g. the metrics port)
            if variable.get("value", "").isdigit() and int(variable["value"]) in running.ports:
                env[variable["name"]] = str(running.ports[int(variable["value"])])
        listen = {f"0.0.0.0:{remote}": f"127.0.0.1:{local}" for remote, local in running.ports.items()}
        command = self._command(container, mounts, listen)
        self._spawn(running, container["name"], command, env)
        if self.on_operator_started is not None and "metrics" in running.named_ports:
            self.on_operator_started(running.name, running.ports[running.named_ports["metrics"]])

    def _start_check(self, pod: dict[str, Any], running: RunningPod) -> None:
        """A test hook pod: its command, with Service URLs pointing at the pods they select."""
        running.root.mkdir(parents=True, exist_ok=True)
        container = pod["spec"]["containers"][0]
        mounts = self._mounts(pod, container, running.root)
        urls = self._service_urls()
        command = self._command(container, mounts, urls)
        self._spawn(running, container["name"], command, self._env(container, mounts, {}))
