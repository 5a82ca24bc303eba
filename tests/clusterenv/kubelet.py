"""A stand-in kubelet for servinglab's pods: runs their containers as local processes.

KWOK moves pods through their phases but runs nothing. For end-to-end tests this harness watches
one namespace and, for the pods the operator created, does what a kubelet would with the very specs
stored in the API: mounts the ConfigMaps (as files), runs the init container's script, starts the
container's command with its args and env, probes the readiness endpoint, and reports back through
the API — readiness via the `kwok.servinglab.dev/ready` annotation, a finished container's exit code
and termination message via the completion annotations KWOK turns into pod status.

Container paths are mapped into a per-pod folder, container ports onto free loopback ports, and
Service DNS names (`http://<service>:<port>`) onto those ports; that is all that is translated.
The load Job runs with a real token of its ServiceAccount, so its RBAC is exercised too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterenv import manifests
from clusterenv.controlplane import Kubectl
from servinglab.local_server import free_ports

VENV_BIN = Path(sys.executable).parent


@dataclass
class RunningPod:
    name: str
    root: Path
    ports: dict[int, int] = field(default_factory=dict)  # container port -> local port
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ready: bool = False
    done: bool = False


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
    ) -> None:
        """`on_server_started(pod, metrics_port)` lets monitoring scrape the server; `job_outcome`
        (exit code, message) replaces the real load run, to play a Job that dies (e.g. OOMKilled)."""
        self.on_server_started = on_server_started
        self.job_outcome = job_outcome
        self.kubectl = kubectl
        self.namespace = namespace
        self.workdir = workdir
        self.api_server = api_server
        self.ca_cert = ca_cert
        self.pods: dict[str, RunningPod] = {}
        self.services: dict[str, dict[int, int]] = {}  # service name -> port -> local port
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="local-kubelet", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> LocalKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for pod in list(self.pods.values()):
            self._kill(pod)

    def kill_server(self) -> None:
        """Crash the server: kill its processes and report the container terminated, as a kubelet would."""
        for pod in list(self.pods.values()):
            if pod.ports and not pod.done:
                self._kill(pod)
                pod.done = True
                status = {
                    "status": {
                        "phase": "Failed",
                        "message": "container torchserve exited",
                        "containerStatuses": [
                            {
                                "name": "torchserve",
                                "image": "pytorch/torchserve:0.12.0-gpu",
                                "ready": False,
                                "restartCount": 0,
                                "state": {"terminated": {"exitCode": 137, "reason": "Error", "message": "killed"}},
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
        pods = self.kubectl.get("pods", "-n", self.namespace)["items"]
        for pod in pods:
            name = pod["metadata"]["name"]
            component = pod["metadata"].get("labels", {}).get("app.kubernetes.io/component")
            if pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
                continue
            if name not in self.pods and component in ("server", "load"):
                # a short root: TorchServe puts unix sockets under the pod's /tmp (108-byte limit)
                self.pods[name] = RunningPod(name, Path(tempfile.mkdtemp(prefix="kl-", dir=self.workdir)))
                (self._start_server if component == "server" else self._start_job)(pod, self.pods[name])
            running = self.pods.get(name)
            if running is None or running.done:
                continue
            if component == "server" and not running.ready and self._probe(pod, running):
                running.ready = True
                self.kubectl.run("annotate", "pod", name, "-n", self.namespace, f"{manifests.READY_ANNOTATION}=true")
            if component == "load":
                self._finish_job_if_exited(running)

    # -- translation -----------------------------------------------------------------------------

    def _mounts(self, pod: dict[str, Any], container: dict[str, Any], root: Path) -> dict[str, Path]:
        """Container mount path -> local folder, with ConfigMap volumes written out as files."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        mapping: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            local = root / "v" / mount["name"]
            volume = volumes[mount["name"]]
            if "configMap" in volume and not local.exists():
                data = self.kubectl.get("configmap", volume["configMap"]["name"], "-n", self.namespace).get("data", {})
                items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
                local.mkdir(parents=True)
                for item in items:
                    (local / item["path"]).write_text(data[item["key"]])
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

    def _env(self, container: dict[str, Any], mounts: dict[str, Path], extra: dict[str, str]) -> dict[str, str]:
        env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", **extra}
        for variable in container.get("env", []):
            if "value" in variable:
                env[variable["name"]] = self._translate(variable["value"], mounts, {})
            elif variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                env[variable["name"]] = self.namespace
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
        return process

    # -- the server pod --------------------------------------------------------------------------

    def _start_server(self, pod: dict[str, Any], running: RunningPod) -> None:
        running.root.mkdir(parents=True, exist_ok=True)
        spec = pod["spec"]
        for init in spec.get("initContainers", []):
            mounts = self._mounts(pod, init, running.root)
            script = [self._translate(part, mounts, {}) for part in [*init["command"], *init.get("args", [])]]
            init_process = self._spawn(running, f"init-{init['name']}", script, self._env(init, mounts, {}))
            if init_process.wait(timeout=300) != 0:
                raise RuntimeError(f"init container {init['name']} of {running.name} failed")
        container = spec["containers"][0]
        mounts = self._mounts(pod, container, running.root)
        ports = [p["containerPort"] for p in container.get("ports", [])] + [8081, 7070, 7071]
        running.ports = dict(zip(ports, free_ports(len(ports)), strict=True))
        # config files the container reads are the ConfigMap's, with listen addresses made local
        config_dir = mounts["/etc/torchserve"]
        properties = config_dir / "config.properties"
        text = self._translate(properties.read_text(), mounts, {})
        for remote, local in running.ports.items():
            text = re.sub(rf"(//[0-9.]+):{remote}\b", rf"\g<1>:{local}", text)
            text = re.sub(rf"^(grpc_\w+_port)={remote}$", rf"\g<1>={local}", text, flags=re.MULTILINE)
        text = text.replace("0.0.0.0", "127.0.0.1")
        # the simulated node's GPU is not on this machine
        text = re.sub(r"^number_of_gpu=.*$", "number_of_gpu=0", text, flags=re.MULTILINE)
        properties.write_text(text)
        env = self._env(container, mounts, {"TMPDIR": str(mounts["/tmp"])})
        command = [self._translate(part, mounts, {}) for part in [*container["command"], *container.get("args", [])]]
        command[0] = str(VENV_BIN / command[0])
        self._spawn(running, container["name"], command, env)
        if self.on_server_started is not None:
            self.on_server_started(running.name, running.ports[8082])
        service_ports = {p["containerPort"]: running.ports[p["containerPort"]] for p in container.get("ports", [])}
        for service in self.kubectl.get("services", "-n", self.namespace)["items"]:
            self.services[service["metadata"]["name"]] = service_ports

    def _probe(self, pod: dict[str, Any], running: RunningPod) -> bool:
        probe = pod["spec"]["containers"][0].get("readinessProbe", {}).get("httpGet")
        if not probe:
            return True
        named = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0].get("ports", [])}
        port = running.ports[named.get(probe["port"], probe["port"])]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{probe['path']}", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    # -- the load Job's pod ------------------------------------------------------------------------

    def _start_job(self, pod: dict[str, Any], running: RunningPod) -> None:
        running.root.mkdir(parents=True, exist_ok=True)
        container = pod["spec"]["containers"][0]
        mounts = self._mounts(pod, container, running.root)
        urls = {
            f"http://{service}:{remote}": f"http://127.0.0.1:{local}"
            for service, ports in self.services.items()
            for remote, local in ports.items()
        }
        credentials = running.root / "serviceaccount"
        credentials.mkdir()
        account = pod["spec"].get("serviceAccountName", "default")
        token = self.kubectl.run("create", "token", account, "-n", self.namespace).stdout.strip()
        (credentials / "token").write_text(token)
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
        )
        command = [self._translate(part, mounts, urls) for part in [*container["command"], *container.get("args", [])]]
        command[0] = str(VENV_BIN / command[0])
        command += ["--termination-log", str(running.root / "termination-log")]
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
        running.done = True
        log = running.root / "termination-log"
        message = log.read_text() if log.exists() else ""
        self.kubectl.run(
            "annotate", "pod", running.name, "-n", self.namespace,
            f"{manifests.EXIT_CODE_ANNOTATION}={code}", f"{manifests.MESSAGE_ANNOTATION}={message}",
        )  # fmt: skip
