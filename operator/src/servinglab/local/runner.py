"""The local runner behind `servinglab run FILE`: one experiment on this machine, no cluster.

Flow: prepare the model (built in a child process: torch stays out of this one) -> start the server the
spec names (:func:`servinglab.servers.get`) -> wait for every worker (cold start) -> check one request
and that the server applied the requested batch size, delay and workers -> measure every load level
(:mod:`servinglab.measure.driver`) -> the model alone (the ceiling, in a child process, after the server
stopped) -> the typed results document. The server is stopped on success, failure, Ctrl-C or SIGTERM;
its work directory (configs, logs) is kept only on failure.

The caller must have imported Locust first (see :mod:`servinglab.entry`).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from servinglab import servers
from servinglab.api import ExperimentSpec, ServerSpec, ServingExperiment
from servinglab.api.ceiling import Ceiling
from servinglab.api.conditions import now
from servinglab.api.results import ExperimentResults, Runtime
from servinglab.loadgen import shapes
from servinglab.loadgen.hooks import ProgressFn
from servinglab.loadgen.levels import Target
from servinglab.loadgen.payloads import PayloadError, request_payloads
from servinglab.measure import ceiling
from servinglab.measure.document import experiment_results, with_ceiling
from servinglab.measure.driver import ServerWindows, measure_load
from servinglab.measure.raw import probe as raw_probe
from servinglab.measure.raw.figures import RawCache
from servinglab.measure.telemetry import LocalTelemetry
from servinglab.models import forms
from servinglab.servers.base import (
    LocalServer,
    ModelError,
    PortTaken,
    ServedModel,
    Server,
    ServerError,
    not_applied,
)
from servinglab.servers.handler import powers_of_two_up_to
from servinglab.servers.process import start_ready, visible_gpus


class RunError(RuntimeError):
    """The experiment could not produce trustworthy results; the message says why."""


@dataclass
class RunHooks:
    """Callbacks for the console: phase messages and per-tick load progress."""

    phase: Callable[[str], None] = lambda message: None
    progress: ProgressFn | None = None


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
    """The local server experiments run on: one per `run`, or one reused by a sweep's trials.

    With `reuse`, a later experiment on the same model and server kind does not start a new server when
    that kind can be reconfigured in place (TorchServe: the model registered again through its
    management API, which costs the workers' start, not the frontend's); a kind that cannot (LitServe) is
    restarted with the new configuration from the model it has. A server that failed is replaced. The work
    directory (configs, logs) is kept if anything failed.
    """

    def __init__(self, name: str, hooks: RunHooks, reuse: bool = False) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"servinglab-{name}-"))
        self.hooks = hooks
        self.reuse = reuse
        self.server: LocalServer | None = None
        self.kind: str | None = None
        self.model: ServedModel | None = None
        self.failed = False

    def serve(self, experiment: ServingExperiment) -> tuple[LocalServer, float, bool]:
        """A ready server configured for the experiment: (server, seconds until ready, reconfigured in
        place). A server that cannot be reconfigured in place is restarted with the new configuration
        from the model it already has (its restart is the trial's cold start)."""
        spec = experiment.spec
        kind = servers.get(spec.server.kind)
        same = self.server is not None and self.kind == kind.kind and self.server.model_name == spec.model.name
        same = same and self.model is not None and self.model.form_spec == spec.server.form  # a form is built anew
        if self.server is not None and same and self.reuse:
            _refuse_gpu_paths_without_a_gpu(spec.server, self.server.gpus)
            if kind.capabilities.in_place_reconfiguration:
                self.hooks.phase(f"Reconfiguring {kind.name}: {experiment.metadata.name}")
                return self.server, self.server.reconfigure(spec.server, spec.load), True
            self.hooks.phase(f"Restarting {kind.name} with the new configuration: {experiment.metadata.name}")
            began = time.monotonic()
            try:
                seconds = self.server.reconfigure(spec.server, spec.load)
            except PortTaken as exc:  # it restarts on the same ports: start it on others, from the same model
                assert self.model is not None
                self.stop_server()
                server, _ = self._start(kind, spec, self.model, taken=exc)
                return server, time.monotonic() - began, False  # the restart's cold start, from its stop
            self.hooks.phase(f"{kind.name} ready in {seconds:.1f} s")
            return self.server, seconds, False
        self.stop_server()
        _refuse_gpu_paths_without_a_gpu(spec.server, visible_gpus())
        if (refused := forms.refusal(spec.server, visible_gpus())) is not None:
            raise RunError(f"FormNotSupported: {refused}")
        self.hooks.phase(f"Preparing model {spec.model.name}")
        try:
            self.model = model = _with_form(spec.server, kind.prepare_model(spec, self.workdir), self.hooks)
        except ModelError as exc:
            raise RunError(f"{exc.reason}: {exc}") from None
        self.hooks.phase(f"Starting {kind.name}")
        server, cold_start = self._start(kind, spec, model)
        return server, cold_start, False

    def _start(
        self, kind: Server, spec: ExperimentSpec, model: ServedModel, taken: PortTaken | None = None
    ) -> tuple[LocalServer, float]:
        """A new server for the model, ready, and the seconds that took: started again on other ports when a
        port picked for it was taken before it bound it, at most PORT_ATTEMPTS starts (`taken`: a restart that
        found its port taken, the first of them). The slot holds it once it is ready: start_ready stops a start
        that fails (an interrupt too), so a failed start leaves the slot empty."""

        def make() -> LocalServer:  # each one picks new ports
            return kind.local(spec.model.name, model.directory, spec, self.workdir, self.reuse)

        def retrying(taken: PortTaken) -> None:  # the only record: a run that then succeeds removes its workdir
            self.hooks.phase(f"{taken.server} could not listen ({taken.said}); starting it again on other ports")

        server, cold_start = start_ready(make, spec.server.startup_timeout_seconds, taken=taken, retrying=retrying)
        self.server, self.kind = server, kind.kind
        self.hooks.phase(f"{kind.name} ready in {cold_start:.1f} s")
        return server, cold_start

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


def _with_form(server: ServerSpec, model: ServedModel, hooks: RunHooks) -> ServedModel:
    """The model with its form (`server.form`) built or found built, gated and put beside it."""
    if server.form is None:
        return model
    hooks.phase(f"Form {server.form}: built once per content, checked against eager fp32")
    try:
        run = forms.prepare(server, model.packed, powers_of_two_up_to(server.batch_size), visible_gpus() > 0)
    except forms.FormError as exc:
        raise ModelError(exc.reason, str(exc)) from None
    if run is not None:
        built = "found in the cache" if run.cached else f"built in {run.build_seconds:.1f} s"
        hooks.phase(f"Form {run.form} ({run.backend}{f', {run.provider}' if run.provider else ''}): {built}")
    return dataclasses.replace(model, form=run, form_spec=server.form)


def _refuse_gpu_paths_without_a_gpu(server: ServerSpec, gpus: int) -> None:
    """A data path that needs CUDA, on a machine that shows none: refused before the server starts (the
    spec asks for GPUs, but this machine has none visible)."""
    if gpus == 0 and (needs := server.data_path.gpu_only()):
        raise RunError(
            f"server.dataPath.{needs[0]} needs a GPU, and none is visible on this machine (nvidia-smi, "
            "CUDA_VISIBLE_DEVICES); run it where a GPU is, or use the CPU's options (decode: cpu, decodeThreads)"
        )


def run_local(
    experiment: ServingExperiment, hooks: RunHooks | None = None, raw_cache: RawCache | None = None
) -> ExperimentResults:
    """Run the experiment against a local server and return its results."""
    hooks = hooks or RunHooks()
    with interrupts_stop_the_run():
        slot = ServerSlot(experiment.metadata.name, hooks)
        try:
            return run_in(slot, experiment, raw_cache)
        finally:
            slot.close()


def run_in(slot: ServerSlot, experiment: ServingExperiment, raw_cache: RawCache | None = None) -> ExperimentResults:
    """One experiment on the slot's server; `raw_cache` lets several experiments (a sweep's trials)
    measure the model alone at each batch size once. Raises :class:`RunError` on failure."""
    spec, hooks = experiment.spec, slot.hooks
    started_at = now()
    if spec.server.replicas > 1:  # one local server process: several need a cluster's Service to share them
        raise RunError(
            f"server.replicas: {spec.server.replicas}; a local run serves from one server (replicas: 1); run "
            "several replicas on Kubernetes (kubectl apply), where a Service spreads the load between them"
        )
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
            document = document.model_copy(
                update={"reconfigured_seconds": document.cold_start_seconds, "cold_start_seconds": None}
            )
        if not slot.reuse:
            slot.stop_server()  # then the model alone has the machine to itself
        if spec.ceiling.enabled and (found := _ceiling(experiment, document, slot.model, server.gpus > 0, hooks,
                                                        raw_cache)):  # fmt: skip
            document = with_ceiling(document, found)
    except ServerError as exc:
        slot.failed = True
        slot.stop_server()
        raise RunError(str(exc)) from None
    except RunError:
        slot.failed = True
        slot.stop_server()
        raise
    return document.model_copy(update={"started_at": started_at})


def _ceiling(
    experiment: ServingExperiment,
    document: ExperimentResults,
    served: ServedModel,
    gpu: bool,
    hooks: RunHooks,
    cache: RawCache | None,
) -> Ceiling | None:
    spec, description = experiment.spec, served.description
    if spec.model.source is None:
        target = spec.model.name
    elif description.input is not None:  # packed with servinglab's handler: measurable alone, as served
        target = str(served.packed)
    else:
        return None  # an archive's own handler: servinglab cannot run its model alone
    if not description.flops_per_inference:
        return None
    sizes = ceiling.plan(spec, document.results)
    precision, seconds, device = str(spec.server.precision), spec.ceiling.raw_seconds, "cuda" if gpu else "cpu"
    compiled = "" if spec.server.data_path.compile == "none" else f", compile {spec.server.data_path.compile}"
    form = f", form {spec.server.form}" if spec.server.form is not None else ""
    hooks.phase(
        f"Ceiling: {spec.model.name} alone in-process, {precision}{compiled}{form}, at the formed batch size "
        f"{sizes[0]} and the best of {sorted(sizes)}, within {seconds:g} s"
    )
    try:
        options = ceiling.served_form_options(spec.server, served.packed)
        figures = raw_probe.measure(target, precision, device, sizes, seconds, hooks.phase, cache, options)
        alone = None
        if spec.ceiling.forms and spec.model.source is None:  # the forms' probe builds the built-ins alone
            wanted = [str(form) for form in ceiling.CPU_FORMS] + (["tensorrt"] if gpu else [])
            alone = raw_probe.measure_forms(target, precision, device, sizes[0], wanted, seconds,
                                            str(forms.cache_dir() / "raw"), hooks.phase)  # fmt: skip
    except raw_probe.RawProbeError as exc:
        raise RunError(str(exc)) from None
    found = ceiling.ceiling_of(spec, document.results, description.flops_per_inference, figures, device)
    served_form = str(spec.server.form or "eager")  # a built-in as it comes runs eager
    return found.model_copy(update={
        "form": str(spec.server.form) if spec.server.form is not None else None, "forms_alone": alone,
        "best_form": ceiling.best_form(served_form, alone) if alone is not None else None,
    })  # fmt: skip


def _measure(
    experiment: ServingExperiment, server: LocalServer, model: ServedModel, cold_start: float, hooks: RunHooks
) -> ExperimentResults:
    spec = experiment.spec
    try:
        payloads = request_payloads(spec.load.payload, model.image_size, Path.cwd())
    except PayloadError as exc:
        raise RunError(str(exc)) from None

    first = payloads[0]
    status, answer = server.predict(first.body, first.content_type, timeout=spec.load.request_timeout_seconds)
    if status != 200:
        raise RunError(f"the server answered a test request with HTTP {status}: {answer}")
    effective = server.effective()
    if (differs := not_applied(spec.server, effective)) is not None:
        raise RunError(differs)

    def fetch_metrics() -> str:
        server.check_alive()
        return server.metrics_text()

    kind = servers.get(spec.server.kind)
    target = Target(server.inference_url, server.request_path, payloads, spec.load.payload.check, Path.cwd(),
                    kind.request_protocol(server.model_name))  # fmt: skip
    hooks.phase(f"Load: {spec.load.describe()}")
    telemetry = LocalTelemetry(server.worker_process_ids, server.gpus)
    windows = ServerWindows(fetch_metrics, kind.metrics(server.model_name), telemetry)
    try:
        measured = measure_load(spec.load, spec.slo.p99_latency_ms, target, windows, hooks.progress)
    except shapes.TraceError as exc:  # e.g. a payload index past the bodies there are
        raise RunError(str(exc)) from None
    server.check_alive()
    notes = server.notes()
    runtime = Runtime(
        mode="local", device="cuda" if server.gpus > 0 else "cpu", precision_note=notes.precision_note,
        data_path=notes.data_path, form=model.form, warmup=notes.warmup, cpu_count=os.cpu_count(),
        machine=platform.machine(),
        gpu_telemetry=telemetry.note,
    )  # fmt: skip
    return experiment_results(
        experiment.metadata.name, spec, measured.levels, runtime=runtime, effective=effective,
        cold_start_seconds=cold_start, peak_rate=measured.peak_rate, utilisation=measured.utilisation,
        model=model.description, finished_at=now(),
    )  # fmt: skip
