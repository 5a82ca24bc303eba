"""A real LitServe as a child process: render its script, start it, wait for every worker, read, stop.

The local runner and the LitServe tests use this. The server runs the rendered script (the same one a pod
and an export run) with this venv's Python, on free loopback ports, in its own process group (its API
processes, its inference workers and its queue manager go with it), its counters in a folder of its own
work directory. It runs under a watchdog (:mod:`servinglab.lifeline`, through
:func:`~servinglab.servers.process.start_guarded`): the group ends when this process stops it or dies,
SIGKILL included. LitServe has no management API: a new configuration is a restart from the same model
folder (:meth:`LocalLitServe.reconfigure`, whose seconds are what a sweep's trial pays for it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from servinglab import lifeline
from servinglab.api import ExperimentSpec, LoadSpec, ServerSpec
from servinglab.api.results import EffectiveSettings
from servinglab.servers.base import RuntimeNotes, ServerError
from servinglab.servers.handler import handler_notes
from servinglab.servers.litserve.config import API_PATH, METRICS_DIR_ENV, SCRIPT, render_script
from servinglab.servers.litserve.metrics import effective as reported_settings
from servinglab.servers.litserve.metrics import parse
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

#: How long LitServe may take to stop on SIGTERM before what is left of it is killed.
STOP_GRACE_SECONDS = 15.0


class LocalLitServe:
    """One LitServe serving one model folder (laid out for LitServe), configured from the spec."""

    def __init__(self, model_name: str, model_dir: Path, spec: ExperimentSpec, workdir: Path) -> None:
        self.model_name = model_name
        self.model_dir = model_dir
        self.spec = spec
        self.workdir = workdir / "litserve"
        inference, metrics_port = free_ports(2)
        self.inference = f"http://127.0.0.1:{inference}"
        self.metrics_address = f"127.0.0.1:{metrics_port}"
        self.gpus = visible_gpus()
        self.guard: lifeline.Guarded | None = None
        self.process: subprocess.Popen[bytes] | None = None  # the watchdog; its exit status is LitServe's
        self.started_at: float | None = None
        self.output = ServerOutput(self.log)

    @property
    def server(self) -> ServerSpec:
        return self.spec.server

    @property
    def failure_log(self) -> Path:
        return self.workdir / "failure-log"

    @property
    def log(self) -> Path:
        return self.workdir / "litserve.log"

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        script = self.workdir / SCRIPT
        script.write_text(render_script(self.spec, self.gpus, str(self.model_dir)))
        self.failure_log.unlink(missing_ok=True)
        env = {**os.environ, METRICS_DIR_ENV: str(self.workdir / "metrics"), "PYTHONUNBUFFERED": "1"}
        command = [
            sys.executable, str(script), "--model-dir", str(self.model_dir),
            "--listen", self.inference.removeprefix("http://"), "--metrics-listen", self.metrics_address,
            "--failure-log", str(self.failure_log),
        ]  # fmt: skip
        self.output.starting()
        self.started_at = time.monotonic()
        # own process group under a watchdog: the API processes, workers and queue manager go with it
        self.guard = start_guarded(command, log=self.log, cwd=self.workdir, env=env, grace_seconds=STOP_GRACE_SECONDS)
        self.process = self.guard.process

    def wait_ready(self, timeout_seconds: float) -> float:
        """Block until LitServe's /health says every worker is set up (the model loaded and warmed up)
        and the workers' own report counts them all; the seconds since start (the cold start)."""
        assert self.started_at is not None, "start() first"
        deadline = self.started_at + timeout_seconds
        last = "no answer yet"
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if self._http(f"{self.inference}/health", 5.0) == b"ok":
                    ready = self.effective().ready_workers or 0
                    if ready >= self.server.workers:
                        self.output.up = True
                        return time.monotonic() - self.started_at
                    last = f"{ready}/{self.server.workers} workers ready"
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.3)
        raise ServerError(
            f"LitServe was not ready within {timeout_seconds:.0f} s (server.startupTimeoutSeconds; {last}); "
            f"log: {self.log}"
        )

    def reconfigure(self, server: ServerSpec, load: LoadSpec | None) -> float:
        """LitServe has no management API: stop, render the script with the new settings and start again
        from the same model folder. Returns the seconds from the stop until every worker was ready."""
        began = time.monotonic()
        self.stop()
        self.spec = self.spec.model_copy(update={"server": server, "load": load or self.spec.load})
        self.start()
        self.wait_ready(server.startup_timeout_seconds)
        return time.monotonic() - began

    def check_alive(self) -> None:
        """Raise :class:`ServerError` when the server has died or a worker could not load the model (the
        reason first, e.g. "ModelLoadFailed: ...": LitServe itself would go on with the other workers)."""
        said = self.failure_log.read_text().strip() if self.failure_log.is_file() else ""
        if said:
            self.stop()
            raise ServerError(f"{said}; log: {self.log}")
        if self.process is not None and self.process.poll() is not None:
            raise self.output.exit_error("LitServe", self.process.returncode, self.log, self.log_tail())

    def log_tail(self, lines: int = 20) -> str:
        return tail_of(self.log, lines)

    def stop(self) -> None:
        """End the process group (SIGTERM, SIGKILL after STOP_GRACE_SECONDS), then kill any survivor;
        idempotent."""
        if self.guard is None:
            return
        stop_guarded(self.guard)
        self.guard = None
        self.process = None
        shutil.rmtree(self.workdir / "metrics", ignore_errors=True)

    # -- HTTP ------------------------------------------------------------------------------------

    @staticmethod
    def _http(url: str, timeout: float) -> bytes:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: bytes = response.read()
            return body

    @property
    def inference_url(self) -> str:
        return self.inference

    @property
    def request_path(self) -> str:
        return API_PATH

    def predict(self, body: bytes, content_type: str, timeout: float = 60.0) -> tuple[int, Any]:
        return post(self.inference + API_PATH, body, content_type, timeout)

    def metrics_text(self) -> str:
        """The metrics port's text; a scrape that fails now and then (a worker's counter file caught being
        made) is read again, and one that keeps failing is the server's failure, not the caller's crash."""
        url = f"http://{self.metrics_address}/metrics"
        for attempt in range(5):
            try:
                return self._http(url, 10.0).decode()
            except urllib.error.HTTPError as exc:
                if attempt == 4:
                    raise ServerError(
                        f"LitServe's metrics answered HTTP {exc.code} five times; log: {self.log}"
                    ) from None
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def effective(self) -> EffectiveSettings:
        """What the workers report they run with (their gauges), with how many have loaded the model."""
        return reported_settings(parse(self.metrics_text()))

    def worker_process_ids(self) -> list[int]:
        """The processes LitServe spawned (its inference workers, and its API processes: they cannot be told
        apart from outside); the verdicts read their CPU."""
        return descendants_running(self.process, "spawn_main")

    def notes(self) -> RuntimeNotes:
        """What the workers' handlers said: the precision's realisation, the data path (the latest worker's)
        and the slowest warm-up."""
        return handler_notes(self.log.read_text(errors="replace") if self.log.exists() else "", self.server.workers)
