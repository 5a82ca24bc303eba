"""A real TorchServe as a child process: configure, start, wait for every worker, read, stop.

The local runner and the TorchServe tests use this. Each server gets its own work directory (config,
model store, logs, temp — TorchServe keeps its pid file in the temp dir, so two servers never clash)
and free loopback ports. TorchServe runs in its own process group under a watchdog
(:mod:`servinglab.lifeline`): stopping ends the whole group (Java frontend and Python workers) and then
kills whatever is left, and the watchdog does the same when this process dies without stopping it
(SIGKILL included), so nothing outlives it.

Every local user can reach the loopback ports. What they cannot do is run code in the server: the
config's `allowed_urls` refuses a model or workflow from any URL or path but a name in the model store,
and the model store lies in the work directory, which must not be writable by other users.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from servinglab import lifeline
from servinglab.api import LoadSpec, ServerSpec
from servinglab.api.results import EffectiveSettings
from servinglab.models.catalogue import HANDLER_FILE
from servinglab.servers.base import RuntimeNotes, ServerError
from servinglab.servers.process import (
    ServerOutput,
    descendants_running,
    free_ports,
    post,
    start_guarded,
    stop_guarded,
    tail_of,
    visible_gpus,
)
from servinglab.servers.torchserve.config import (
    Addresses,
    config_properties,
    render_metrics_config,
    render_model_config,
    render_properties,
)
from servinglab.servers.torchserve.java import find_java_home
from servinglab.servers.torchserve.logs import Mark, load_failure, mark, read_from, registration_notes

_LINK_ABOVE_BYTES = 1 << 20
#: How long TorchServe may take to stop on SIGTERM before what is left of it is killed.
STOP_GRACE_SECONDS = 15.0


@dataclass(frozen=True)
class WorkerStatus:
    """What the management API says about the model: effective settings and worker states."""

    batch_size: int
    max_batch_delay_ms: int
    min_workers: int
    max_workers: int
    worker_states: tuple[str, ...]

    @property
    def ready_workers(self) -> int:
        return sum(1 for state in self.worker_states if state == "READY")

    def effective(self) -> EffectiveSettings:
        return EffectiveSettings(
            batch_size=self.batch_size, max_batch_delay_ms=self.max_batch_delay_ms, min_workers=self.min_workers,
            max_workers=self.max_workers, ready_workers=self.ready_workers,
        )  # fmt: skip


class LocalTorchServe:
    """One TorchServe serving one model from a no-archive directory, configured from a ServerSpec."""

    def __init__(
        self,
        model_name: str,
        archive: Path,
        server: ServerSpec,
        workdir: Path,
        load: LoadSpec | None = None,
        model_api: bool = False,
    ) -> None:
        self.model_name = model_name
        self.archive = archive
        self.server = server
        self.load = load  # bounds the batch sizes the handler warms up
        self.model_api = model_api  # register/unregister through the management API (reconfigure)
        self.workdir = workdir
        ports = free_ports(5)
        self.addresses = Addresses(
            inference=f"http://127.0.0.1:{ports[0]}",
            management=f"http://127.0.0.1:{ports[1]}",
            metrics=f"http://127.0.0.1:{ports[2]}",
            grpc_inference_port=ports[3],
            grpc_management_port=ports[4],
        )
        self.guard: lifeline.Guarded | None = None
        self.process: subprocess.Popen[bytes] | None = None  # the watchdog; its exit status is TorchServe's
        self.started_at: float | None = None
        # the launcher's output: the frontend's logs and what they lack, the exception it ended with
        self.output = ServerOutput(self.workdir / "logs" / "launcher.log")
        # where the model log and ts_log stood when the current registration began: what follows is its
        self.registered_at = (Mark(), Mark())
        self.gpus = visible_gpus()
        self.tmpdir: Path | None = None

    # -- files -----------------------------------------------------------------------------------

    def prepare(self) -> Path:
        """Write config.properties, metrics.yaml and a model store holding this experiment's copy
        of the model directory with its rendered model-config.yaml; return the config path."""
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.workdir.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            # TorchServe loads what its model store holds, and resolves a relative registration path
            # against this directory (its working directory): others must not be able to put a model here
            raise ServerError(
                f"the work directory {self.workdir} is writable by other users "
                f"(mode {stat.S_IMODE(self.workdir.stat().st_mode):o}); use a private one (e.g. mode 700)"
            )
        store = self.workdir / "model-store"
        model_dir = store / self.model_name
        if model_dir.exists():
            shutil.rmtree(model_dir)
        model_dir.mkdir(parents=True)
        for entry in self.archive.iterdir():
            target = model_dir / entry.name
            if entry.is_dir():
                shutil.copytree(entry, target)
            elif entry.stat().st_size > _LINK_ABOVE_BYTES:
                target.symlink_to(entry.resolve())  # weights: hundreds of MB, read-only
            else:
                shutil.copy2(entry, target)
        (model_dir / "model-config.yaml").write_text(render_model_config(self.server, self.load))
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        metrics_path = self.workdir / "metrics.yaml"
        metrics_path.write_text(render_metrics_config())
        properties = config_properties(
            self.model_name,
            self.server,
            model_store=str(store),
            metrics_config=str(metrics_path),
            addresses=self.addresses,
            number_of_gpu=self.gpus,
            model_api=self.model_api,
        )
        config_path = self.workdir / "config.properties"
        config_path.write_text(render_properties(properties))
        return config_path

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        config_path = self.prepare()
        # TorchServe puts its worker sockets and pid file in the temp dir: keep its path short
        # (unix socket paths are limited to 108 bytes) and private to this server.
        self.tmpdir = Path(tempfile.mkdtemp(prefix="sl-ts-"))
        env = dict(os.environ)
        java_home = find_java_home()
        env.update(
            JAVA_HOME=str(java_home),
            PATH=os.pathsep.join([str(Path(sys.executable).parent), str(java_home / "bin"), env["PATH"]]),
            LOG_LOCATION=str(self.workdir / "logs"),
            METRICS_LOCATION=str(self.workdir / "logs"),
            TEMP=str(self.tmpdir),
            TMPDIR=str(self.tmpdir),
            PYTHONUNBUFFERED="1",
        )
        env.pop("TS_CONFIG_FILE", None)  # would silently win over --ts-config
        launcher = Path(sys.executable).with_name("torchserve")
        command = [
            str(launcher) if launcher.exists() else "torchserve",
            "--start", "--foreground", "--ncs",
            "--ts-config", str(config_path),
            "--model-store", str(self.workdir / "model-store"),
            "--disable-token-auth",
        ]  # fmt: skip
        self.output.starting()
        self.started_at = time.monotonic()
        self.registered_at = self._marks()
        self.guard = start_guarded(
            command, log=self.workdir / "logs" / "launcher.log", cwd=self.workdir, env=env,
            grace_seconds=STOP_GRACE_SECONDS,
        )  # fmt: skip
        self.process = self.guard.process

    def wait_ready(self, timeout_seconds: float) -> float:
        """Block until all requested workers are READY; return seconds since start (cold start)."""
        assert self.started_at is not None, "start() first"
        return self._wait_workers(self.started_at, timeout_seconds)

    def reconfigure(self, server: ServerSpec, load: LoadSpec | None = None) -> float:
        """Apply another batch size, delay, worker count or precision without restarting the frontend:
        re-render the model's model-config.yaml, unregister the model and register it again from the
        same directory (the YAML governs batching and workers at registration), then wait for every
        worker. Needs `model_api`. Returns the seconds until the workers were ready."""
        assert self.model_api, "reconfigure needs model_api=True"
        started = time.monotonic()
        self.server, self.load = server, load
        model_dir = self.workdir / "model-store" / self.model_name
        (model_dir / "model-config.yaml").write_text(render_model_config(server, load))
        self.registered_at = self._marks()
        self._http(f"{self.addresses.management}/models/{self.model_name}", 60.0, "DELETE")
        query = urllib.parse.urlencode(
            {"url": self.model_name, "initial_workers": server.workers, "synchronous": "true"}
        )
        deadline = started + 30
        while True:  # the frontend may still be tearing the old registration down
            try:
                self._http(f"{self.addresses.management}/models?{query}", server.startup_timeout_seconds, "POST")
                break
            except urllib.error.HTTPError as exc:
                if exc.code != 409 or time.monotonic() > deadline:
                    raise ServerError(f"TorchServe refused to register {self.model_name} again: HTTP {exc.code} "
                                      f"{exc.read().decode(errors='replace')[:300]}") from None  # fmt: skip
                time.sleep(0.2)
        return self._wait_workers(started, server.startup_timeout_seconds)

    def _marks(self) -> tuple[Mark, Mark]:
        return mark(self.workdir / "logs" / "model_log.log"), mark(self.workdir / "logs" / "ts_log.log")

    def _wait_workers(self, since: float, timeout_seconds: float) -> float:
        deadline = since + timeout_seconds
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            self.check_alive()
            self._check_model_loads()
            try:
                status = self.status()
                if status.ready_workers >= self.server.workers:
                    self.output.up = True
                    return time.monotonic() - since
                last_error = f"{status.ready_workers}/{self.server.workers} workers ready"
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last_error = str(exc)
            time.sleep(0.5)
        raise ServerError(
            f"TorchServe was not ready within {timeout_seconds:.0f} s (server.startupTimeoutSeconds; {last_error}); "
            f"logs in {self.workdir / 'logs'}"
        )

    def _check_model_loads(self) -> None:
        """Fail at once when the current registration's workers cannot load the model: TorchServe would
        retry for ever."""
        logs, (model_mark, ts_mark) = self.workdir / "logs", self.registered_at
        model_text, ts_text = read_from(logs / "model_log.log", model_mark), read_from(logs / "ts_log.log", ts_mark)
        failed = load_failure(self.model_name, model_text, ts_text)
        if failed is not None:
            attempts, cause = failed
            raise ServerError(
                f"ModelLoadFailed: TorchServe's workers could not load {self.model_name} "
                f"({attempts} attempts): {cause}; logs in {logs}"
            )

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise self.output.exit_error("TorchServe", self.process.returncode, self.workdir / "logs", self.log_tail())

    def worker_process_ids(self) -> list[int]:
        """The Python workers now running (model_service_worker.py, children of the Java frontend)."""
        return descendants_running(self.process, "model_service_worker.py")

    def log_tail(self, lines: int = 20) -> str:
        """The end of the launcher's output: ts_log's lines and the exception the frontend ended with."""
        return tail_of(self.output.path, lines)

    def stop(self) -> None:
        """End TorchServe's process group (SIGTERM, SIGKILL after STOP_GRACE_SECONDS), then kill any
        descendant that left the group; idempotent. Its temp folder goes too, made even by a start that
        failed before TorchServe ran."""
        if self.guard is not None:
            stop_guarded(self.guard)
            self.guard = None
            self.process = None
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def __enter__(self) -> LocalTorchServe:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- HTTP ------------------------------------------------------------------------------------

    def _http(self, url: str, timeout: float = 10.0, method: str = "GET") -> bytes:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=timeout) as response:
            body: bytes = response.read()
            return body

    def status(self) -> WorkerStatus:
        """Effective settings from the management API (what TorchServe actually applied)."""
        described = json.loads(self._http(f"{self.addresses.management}/models/{self.model_name}"))
        model = described[0]
        return WorkerStatus(
            batch_size=int(model["batchSize"]),
            max_batch_delay_ms=int(model["maxBatchDelay"]),
            min_workers=int(model["minWorkers"]),
            max_workers=int(model["maxWorkers"]),
            worker_states=tuple(str(w.get("status")) for w in model.get("workers", [])),
        )

    def effective(self) -> EffectiveSettings:
        return self.status().effective()

    def metrics_text(self) -> str:
        return self._http(f"{self.addresses.metrics}/metrics").decode()

    @property
    def inference_url(self) -> str:
        return self.addresses.inference

    @property
    def request_path(self) -> str:
        return f"/predictions/{self.model_name}"

    def notes(self, wait_seconds: float = 15.0) -> RuntimeNotes:
        """What the current registration's workers logged about how they run (see
        :func:`~servinglab.servers.torchserve.logs.registration_notes`). Only servinglab's handler (or a
        variant of it, as the verdict tests serve) says so: an archive's own handler is not waited for."""
        ours = (self.workdir / "model-store" / self.model_name / HANDLER_FILE).is_file()
        return registration_notes(self.workdir / "logs" / "model_log.log", self.registered_at[0], self.server.workers,
                                  wait_seconds if ours else 0.0, self.check_alive)  # fmt: skip

    def predict(self, body: bytes, content_type: str, timeout: float = 60.0) -> tuple[int, Any]:
        """One inference request (used by tests and the runner's sanity check)."""
        return post(self.addresses.inference + self.request_path, body, content_type, timeout)
