"""A real `tritonserver` as a child process: write its model repository, start, wait until the model is
READY, reconfigure through the repository API, read (and check) the configuration it serves, stop.

The local runner and the Triton tests use this. Each server has its own work folder (the repository, the
log) and free loopback ports; gRPC is off (the load speaks HTTP). The model is loaded explicitly
(`--model-control-mode=explicit`), so a sweep's next configuration is a new config.pbtxt loaded through
`POST /v2/repository/models/<model>/load`: Triton loads the new instances and swaps them in, the process
and the Python runtime stay. The repository API is restricted to this object (`--http-restricted-api`):
its calls carry a random key made per start (:mod:`secrets`), so another user of this machine, who can
reach the loopback port, is refused (HTTP 403) and can load neither other code nor another configuration.
The key is never logged nor put in an error message; it is on tritonserver's command line (Triton takes it
from nowhere else), which /proc shows other users unless it is mounted with hidepid. Before any load,
what Triton serves is read back and compared with what was written (:meth:`LocalTriton.effective`). A
model that cannot be loaded does not end the server
(`--exit-on-error=false`): the repository index says UNAVAILABLE with Triton's reason, which ends the
wait with `ModelLoadFailed: ...`. tritonserver runs in its own process group under a watchdog
(:mod:`servinglab.lifeline`, through :func:`~servinglab.servers.process.start_guarded`): it and its Python
backend's stubs end when this process stops them or dies, SIGKILL included.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from servinglab import lifeline
from servinglab.api import LoadSpec, ServerSpec
from servinglab.api.results import EffectiveSettings
from servinglab.servers.base import RuntimeNotes, ServerError
from servinglab.servers.handler import handler_notes
from servinglab.servers.process import (
    ServerOutput,
    descendants_running,
    free_ports,
    start_guarded,
    stop_guarded,
    tail_of,
    visible_gpus,
)
from servinglab.servers.triton.config import AppliedConfig, differences, expected, read_applied, render_config
from servinglab.servers.triton.env import TritonEnvMissing, find_env
from servinglab.servers.triton.native import choose_backend, present_backends
from servinglab.servers.triton.repository import CONFIG_FILE, serves_user_model
from servinglab.servers.triton.wire import MODEL_LOAD_FAILED, PROTOCOL, encode_body, request_path

_LOG = "tritonserver.log"
#: The header that carries the key of the restricted repository API.
REPOSITORY_KEY_HEADER = "servinglab-repository-key"
_REPOSITORY_PATHS = "/v2/repository/"
#: How long tritonserver may take to stop on SIGTERM before what is left of it is killed.
STOP_GRACE_SECONDS = 15.0


class LocalTriton:
    """One tritonserver serving one model of servinglab's repository layout, configured from a ServerSpec."""

    def __init__(
        self, model_name: str, prepared: Path, server: ServerSpec, workdir: Path, load: LoadSpec | None = None
    ) -> None:
        self.model_name = model_name
        self.prepared = prepared
        self.server = server
        self.load = load
        self.workdir = workdir
        self.repository = workdir / "repository"
        self.http_port, self.metrics_port = free_ports(2)
        self.gpus = visible_gpus()
        self._repository_key = ""  # made per start
        self.backends: frozenset[str] = frozenset()  # the tritonserver's backends/ (known once started)
        self.guard: lifeline.Guarded | None = None
        self.process: subprocess.Popen[bytes] | None = None  # the watchdog; its exit status is tritonserver's
        self.started_at: float | None = None
        self.output = ServerOutput(self.workdir / _LOG)

    # -- files -----------------------------------------------------------------------------------

    def prepare(self) -> None:
        """The repository: this experiment's copy of the prepared model (weights linked) and its config."""
        target = self.repository / self.model_name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(self.prepared, target, symlinks=True)
        self._write_config(self.server, self.load)

    def _write_config(self, server: ServerSpec, load: LoadSpec | None) -> None:
        config = render_config(self.model_name, server, self.gpus, load, serves_user_model(self.prepared))
        (self.repository / self.model_name / CONFIG_FILE).write_text(config)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            found = find_env()
        except TritonEnvMissing as exc:
            raise ServerError(str(exc)) from None
        self.backends = present_backends(found.backends)
        self.prepare()
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._repository_key = secrets.token_urlsafe(32)
        command = [
            str(found.launcher),
            f"--model-repository={self.repository}",
            "--model-control-mode=explicit", f"--load-model={self.model_name}",
            # load/unload (and the index) only with the key: another local user could load code or a config
            f"--http-restricted-api=model-repository:{REPOSITORY_KEY_HEADER}={self._repository_key}",
            "--exit-on-error=false", "--strict-readiness=true", "--disable-auto-complete-config",
            "--http-address=127.0.0.1", f"--http-port={self.http_port}", "--allow-grpc=false",
            "--metrics-address=127.0.0.1", f"--metrics-port={self.metrics_port}",
            f"--allow-gpu-metrics={'true' if self.gpus else 'false'}",
            *([] if self.gpus else ["--pinned-memory-pool-byte-size=0"]),
            # the stubs' shared-memory regions are named per server: several servers on one machine never meet
            f"--backend-config=python,shm-region-prefix-name=servinglab{self.http_port}_",
            "--exit-timeout-secs=10",
        ]  # fmt: skip
        self.output.starting()
        self.started_at = time.monotonic()
        self.guard = start_guarded(
            command, log=self.workdir / _LOG, cwd=self.workdir, env=environment, grace_seconds=STOP_GRACE_SECONDS
        )
        self.process = self.guard.process

    def wait_ready(self, timeout_seconds: float) -> float:
        """Block until the model is READY (every instance loaded); the seconds since start (cold start)."""
        assert self.started_at is not None, "start() first"
        return self._wait_ready(self.started_at, timeout_seconds)

    def reconfigure(self, server: ServerSpec, load: LoadSpec | None = None) -> float:
        """Another batch size, delay, instance count or precision without restarting tritonserver: the new
        config.pbtxt, loaded through the repository API (Triton loads the new instances, then swaps them in).
        Returns the seconds until the model was READY with it."""
        started = time.monotonic()
        self.server, self.load = server, load
        self._write_config(server, load)
        try:
            self._http(f"/v2/repository/models/{self.model_name}/load", server.startup_timeout_seconds, b"{}")
        except urllib.error.HTTPError as exc:
            raise ServerError(
                f"{MODEL_LOAD_FAILED}: Triton could not load {self.model_name} with the new configuration: "
                f"{_error_of(exc)}; log in {self.workdir / _LOG}"
            ) from None
        return self._wait_ready(started, server.startup_timeout_seconds)

    def _wait_ready(self, since: float, timeout_seconds: float) -> float:
        deadline = since + timeout_seconds
        last = "no answer yet"
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                state, reason = self.model_state()
            except (urllib.error.URLError, OSError, ValueError) as exc:
                state, reason = "", str(exc)
            if state == "READY" and self._metrics_up():
                self.output.up = True
                return time.monotonic() - since
            if state == "UNAVAILABLE" and reason:
                raise ServerError(
                    f"{MODEL_LOAD_FAILED}: Triton could not load {self.model_name}: {reason}; "
                    f"log in {self.workdir / _LOG}"
                )
            last = f"model {state or 'not listed'}" + (f" ({reason})" if reason else "")
            time.sleep(0.25)
        raise ServerError(
            f"Triton was not ready within {timeout_seconds:.0f} s (server.startupTimeoutSeconds; {last}); "
            f"log in {self.workdir / _LOG}"
        )

    def _metrics_up(self) -> bool:
        """Whether the metrics port answers: Triton starts it after the model can be READY, and a window's
        first read must not find it closed."""
        try:
            self.metrics_text()
        except (urllib.error.URLError, OSError):
            return False
        return True

    def model_state(self) -> tuple[str, str]:
        """(state, reason) of the model in the repository index: LOADING, READY, UNAVAILABLE, ..."""
        for entry in json.loads(self._http("/v2/repository/index", 10.0, b"{}")):
            if entry.get("name") == self.model_name:
                return str(entry.get("state", "")), str(entry.get("reason", ""))
        return "", ""

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise self.output.exit_error("Triton", self.process.returncode, self.workdir / _LOG, self.log_tail())

    def worker_process_ids(self) -> list[int]:
        """The model's instances now running: the Python backend's stubs, children of tritonserver."""
        return descendants_running(self.process, "triton_python_backend_stub")

    def log_tail(self, lines: int = 20) -> str:
        return tail_of(self.workdir / _LOG, lines)

    def stop(self) -> None:
        """End the process group (tritonserver and its stubs; SIGTERM, SIGKILL after STOP_GRACE_SECONDS),
        then kill any survivor; idempotent."""
        if self.guard is None:
            return
        stop_guarded(self.guard)
        self.guard = None
        self.process = None

    def __enter__(self) -> LocalTriton:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- HTTP ------------------------------------------------------------------------------------

    def _http(self, path: str, timeout: float = 10.0, data: bytes | None = None, url: str | None = None) -> bytes:
        headers = {REPOSITORY_KEY_HEADER: self._repository_key} if path.startswith(_REPOSITORY_PATHS) else {}
        request = urllib.request.Request(
            (url or self.inference_url) + path, data=data, headers=headers, method="POST" if data else "GET"
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body: bytes = response.read()
            return body

    def applied(self) -> AppliedConfig:
        """The model configuration Triton applied (its model configuration endpoint)."""
        return read_applied(json.loads(self._http(f"/v2/models/{self.model_name}/config")))

    def effective(self) -> EffectiveSettings:
        """What Triton serves; :class:`ServerError` naming each differing field when that is not the
        configuration this object wrote (a load behind its back)."""
        applied = self.applied()
        wanted = expected(self.server, self.gpus, self.load)
        if (differs := differences(self.model_name, wanted, applied)) is not None:
            raise ServerError(differs)
        try:
            self._http(f"/v2/models/{self.model_name}/ready")
            ready = applied.instances  # READY: Triton has loaded every instance
        except urllib.error.HTTPError:
            ready = 0
        effective = applied.effective(ready)
        if self.server.form is None:
            return effective
        # why the form is not on a native backend of this tritonserver (the results say which served)
        choice = choose_backend(self.server.form, self.server.precision, self.backends, PROTOCOL.encoding)
        return effective.model_copy(update={"backend_note": choice.reason})

    def metrics_text(self) -> str:
        return self._http("/metrics", url=f"http://127.0.0.1:{self.metrics_port}").decode()

    @property
    def inference_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def request_path(self) -> str:
        return request_path(self.model_name)

    def notes(self) -> RuntimeNotes:
        """What servinglab's model printed about its precision and warm-up (the slowest of the current
        instances: they warm up side by side)."""
        log = self.workdir / _LOG
        return handler_notes(log.read_text(errors="replace") if log.exists() else "", self.server.workers)

    def predict(self, body: bytes, content_type: str, timeout: float = 60.0) -> tuple[int, Any]:
        """One inference request of a payload (sent as the KServe v2 protocol's binary BYTES element)."""
        data, headers = encode_body(body)
        request = urllib.request.Request(self.inference_url + self.request_path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")


def _error_of(exc: urllib.error.HTTPError) -> str:
    text = exc.read().decode(errors="replace")[:500]
    try:
        return str(json.loads(text).get("error", text))
    except ValueError:
        return text
