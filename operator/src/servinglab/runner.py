"""The local runner behind `servinglab run FILE`: one experiment on this machine, no cluster.

Flow: build the model archive if needed (child process, torch stays out of this one) -> start a real
TorchServe configured from the spec -> wait for every worker (cold start) -> check one request and
the effective settings -> run each load level with warm-up excluded, reading TorchServe's counters
at the edges of each measured window -> assemble the results document. The server is stopped on
success, failure, Ctrl-C or SIGTERM; its work directory (configs, logs) is kept only on failure.

The caller must have imported Locust first (see :mod:`servinglab.entry`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servinglab import ceiling, models, modelsource, rawprobe, results, tsmetrics
from servinglab.loadgen import levels, shapes
from servinglab.loadgen.hooks import LevelHooks, ProgressFn
from servinglab.loadgen.payloads import PayloadError, request_payloads
from servinglab.local_server import LocalTorchServe, ServerError
from servinglab.rawprobe import RawCache
from servinglab.spec import ServingExperiment


class RunError(RuntimeError):
    """The experiment could not produce trustworthy results; the message says why."""


@dataclass
class RunHooks:
    """Callbacks for the console: phase messages and per-tick load progress."""

    phase: Callable[[str], None] = lambda message: None
    progress: ProgressFn | None = None


@dataclass
class ServedModel:
    """What the local TorchServe serves: a no-archive folder, the image side the load generates, and
    (for the user's own model) where it came from and what it is, for the results."""

    directory: Path
    image_size: int
    info: dict[str, Any] | None = None


def resolve_archive(experiment: ServingExperiment, workdir: Path) -> ServedModel:
    """The built-in model's archive (built once), or the user's model fetched, checked and packed.

    A bad source fails with its reason first (ModelDownloadFailed, ModelChecksumMismatch,
    ModelNotRecognized, PrecisionNotSupported), before any server starts."""
    spec = experiment.spec
    size = models.request_image_size(spec.model, spec.load.payload)
    if spec.model.source is None:
        return ServedModel(models.ensure_built(spec.model.name), size)
    try:
        prepared = modelsource.prepare(spec.model, spec.server.precision, workdir)
    except modelsource.ModelSourceError as exc:
        raise RunError(f"{exc.reason}: {exc}") from None
    return ServedModel(prepared.directory, size, prepared.info)


def _worker_statements(logs: Path, marker: str) -> list[str]:
    """What the handler logged after `marker` ("servinglab precision:", ...), oldest first."""
    log = logs / "model_log.log"
    if not log.exists():
        return []
    lines = log.read_text(errors="replace").splitlines()
    return [line.split(marker, 1)[1].strip() for line in lines if marker in line]


def _precision_note(logs: Path) -> str | None:
    """The worker's own statement of how the precision ran (native or emulated), from its log."""
    notes = _worker_statements(logs, "servinglab precision:")
    return notes[-1] if notes else None


def _warmup(logs: Path, workers: int) -> dict[str, Any] | None:
    """The handler's warm-up as the current workers reported it: the slowest worker's seconds (they
    warm up side by side), the batch sizes it ran and those the time budget skipped."""
    reports: list[dict[str, Any]] = [
        json.loads(text) for text in _worker_statements(logs, "servinglab warm-up:")[-workers:]
    ]
    return max(reports, key=lambda report: float(report["seconds"])) if reports else None


class Interrupted(BaseException):  # like KeyboardInterrupt: not an error to catch
    """SIGINT or SIGTERM arrived; raised in the main greenlet so cleanup runs in one place."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def interrupts_stop_the_run() -> Iterator[None]:
    """Deliver SIGINT/SIGTERM to the main greenlet as :class:`Interrupted`.

    A plain Python handler would raise inside whichever greenlet happens to run (often a Locust
    user, mid-request); gevent runs this handler in its own greenlet, which throws into the main one
    where it waits, so `finally` blocks stop the load and the server in order.
    """
    import gevent
    import greenlet

    main = greenlet.getcurrent()
    watchers = [
        gevent.signal_handler(signum, lambda n=signum: main.throw(Interrupted(n)))
        for signum in (signal.SIGINT, signal.SIGTERM)
    ]
    try:
        yield
    finally:
        for watcher in watchers:
            watcher.cancel()


class ServerSlot:
    """The local TorchServe that experiments run on: one per `run`, or one reused by a sweep's trials.

    With `reuse`, a later experiment on the same model does not start a new server: its batch size,
    delay, workers and precision are applied through the management API (the model registered again
    from a re-rendered model-config.yaml), which costs the workers' start, not the Java frontend's.
    A server that failed is replaced. The work directory (configs, logs) is kept if anything failed.
    """

    def __init__(self, name: str, hooks: RunHooks, reuse: bool = False) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"servinglab-{name}-"))
        self.hooks = hooks
        self.reuse = reuse
        self.server: LocalTorchServe | None = None
        self.model: ServedModel | None = None
        self.failed = False

    def serve(self, experiment: ServingExperiment) -> tuple[LocalTorchServe, float, bool]:
        """A ready server configured for the experiment: (server, seconds until ready, reconfigured)."""
        spec = experiment.spec
        if self.server is not None and self.reuse and self.server.model_name == spec.model.name:
            self.hooks.phase(f"Reconfiguring TorchServe: {experiment.metadata.name}")
            seconds = self.server.reconfigure(spec.server, spec.load)
            return self.server, seconds, True
        self.stop_server()
        self.hooks.phase(f"Preparing model {spec.model.name}")
        self.model = model = resolve_archive(experiment, self.workdir)
        server = LocalTorchServe(spec.model.name, model.directory, spec.server, self.workdir, spec.load, self.reuse)
        self.server = server
        self.hooks.phase("Starting TorchServe")
        server.start()
        cold_start = server.wait_ready(spec.server.startup_timeout_seconds)
        self.hooks.phase(f"TorchServe ready in {cold_start:.1f} s")
        return server, cold_start, False

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def close(self) -> None:
        self.stop_server()
        if self.failed:
            self.hooks.phase(f"Server work directory kept for inspection: {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


def run_local(
    experiment: ServingExperiment, hooks: RunHooks | None = None, raw_cache: RawCache | None = None
) -> dict[str, Any]:
    """Run the experiment against a local TorchServe and return the results document."""
    hooks = hooks or RunHooks()
    with interrupts_stop_the_run():
        slot = ServerSlot(experiment.metadata.name, hooks)
        try:
            return run_in(slot, experiment, raw_cache)
        finally:
            slot.close()


def run_in(slot: ServerSlot, experiment: ServingExperiment, raw_cache: RawCache | None = None) -> dict[str, Any]:
    """One experiment on the slot's server; `raw_cache` lets several experiments (a sweep's trials)
    measure the model alone at each batch size once. Raises :class:`RunError` on failure."""
    spec, hooks = experiment.spec, slot.hooks
    started_at = results.now_iso()
    if spec.load.shape is not None and spec.load.shape.trace is not None:
        try:  # a bad trace is refused before any server starts
            shapes.load_trace(spec.load.shape.trace, Path.cwd(), window_seconds=spec.load.stability.window_seconds)
        except shapes.TraceError as exc:
            raise RunError(str(exc)) from None
    try:
        server, ready_seconds, reconfigured = slot.serve(experiment)
        assert slot.model is not None
        document = _measure(experiment, server, slot.model, ready_seconds, hooks)
        if reconfigured:
            document["reconfiguredSeconds"] = document.pop("coldStartSeconds")
        if not slot.reuse:
            slot.stop_server()  # then the model alone has the machine to itself
        if spec.ceiling.enabled and (
            figures := _ceiling(experiment, document, slot.model, server.gpus > 0, hooks, raw_cache)
        ):
            document["ceiling"] = figures
    except ServerError as exc:
        slot.failed = True
        slot.stop_server()
        raise RunError(str(exc)) from None
    except RunError:
        slot.failed = True
        slot.stop_server()
        raise
    document["startedAt"] = started_at
    return document


def _ceiling(
    experiment: ServingExperiment,
    document: dict[str, Any],
    served: ServedModel,
    gpu: bool,
    hooks: RunHooks,
    cache: RawCache | None,
) -> dict[str, Any] | None:
    spec = experiment.spec
    info = served.info or {}
    if spec.model.source is None:
        target, flops = spec.model.name, None
    elif "input" in info:  # packed with servinglab's handler: measurable alone, as served
        target, flops = str(served.directory), float(info.get("flopsPerInference") or 0)
    else:
        return None  # an archive's own handler: servinglab cannot run its model alone
    sizes = ceiling.plan(spec, document["results"])
    precision, seconds, device = str(spec.server.precision), spec.ceiling.raw_seconds, "cuda" if gpu else "cpu"
    hooks.phase(
        f"Ceiling: {spec.model.name} alone in-process, {precision}, at the formed batch size {sizes[0]} "
        f"and the best of {sorted(sizes)}, within {seconds:g} s"
    )
    try:
        figures = rawprobe.measure(target, precision, device, sizes, seconds, hooks.phase, cache)
    except rawprobe.RawProbeError as exc:
        raise RunError(str(exc)) from None
    return ceiling.for_experiment(spec, document["results"], figures, device, flops)


def _measure(
    experiment: ServingExperiment,
    server: LocalTorchServe,
    model: ServedModel,
    cold_start: float,
    hooks: RunHooks,
) -> dict[str, Any]:
    spec = experiment.spec
    try:
        payloads = request_payloads(spec.load.payload, model.image_size, Path.cwd())
    except PayloadError as exc:
        raise RunError(str(exc)) from None

    first = payloads[0]
    status, answer = server.predict(first.body, first.content_type, timeout=spec.load.request_timeout_seconds)
    if status != 200:
        raise RunError(f"TorchServe answered a test request with HTTP {status}: {answer}")
    effective = server.status()
    requested = (spec.server.batch_size, spec.server.max_batch_delay_ms, spec.server.workers)
    applied = (effective.batch_size, effective.max_batch_delay_ms, effective.ready_workers)
    if requested != applied:
        raise RunError(
            "TorchServe did not apply the requested settings (batchSize, maxBatchDelayMs, workers): "
            f"requested {requested}, in effect {applied}"
        )

    def fetch_metrics() -> str:
        server.check_alive()
        return server.metrics_text()

    windows = tsmetrics.WindowReader(fetch_metrics, server.model_name)

    target = levels.Target(
        server.addresses.inference, server.predictions_path, payloads, spec.load.payload.check, Path.cwd()
    )
    hooks.phase(f"Load: {spec.load.describe()}")
    level_hooks = LevelHooks(hooks.progress, windows.window_start, windows.window_end)
    slo = spec.slo.p99_latency_ms
    try:
        outcome = levels.run_load(spec.load, slo, target, level_hooks)
    except shapes.TraceError as exc:  # e.g. a payload index past the bodies there are
        raise RunError(str(exc)) from None
    server.check_alive()
    entries = results.level_entries(outcome.levels, outcome.sweep_levels, windows.breakdowns, slo)
    runtime = {
        "mode": "local",
        "device": "cuda" if server.gpus > 0 else "cpu",
        "precisionNote": _precision_note(server.workdir / "logs"),
        "warmup": (warmup := _warmup(server.workdir / "logs", spec.server.workers)),
        "cpuCount": os.cpu_count(),
        "machine": platform.machine(),
    }
    document = results.document(
        experiment,
        entries,
        cold_start,
        effective.to_json(),
        runtime,
        started_at="",
        finished_at=results.now_iso(),
        peak_rate=outcome.peak,
    )
    document["warmupSeconds"] = warmup["seconds"] if warmup else None
    if model.info is not None:
        document["modelInfo"] = model.info
    return document
