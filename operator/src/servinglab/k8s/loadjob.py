"""The load Job's program (`servinglab loadtest`): measure a server that runs in the cluster and store
the results where the operator reads them.

Pod 0 of the Job (the only pod, unless `load.generators` > 1) waits until the server answers a first
request, checks the settings the server says it applied (where its metrics say, as LitServe's do, or its
inference port, as Triton's model configuration endpoint does) against the spec, measures every level
through the measurement driver (:mod:`servinglab.measure.driver`), reading the server's metrics at each
window's edges, and writes a :class:`LoadJobResults` into the experiment's results ConfigMap
(:mod:`servinglab.k8s.sink`). The other pods of an indexed Job join pod 0 and generate their share of each
level. Each way of ending has its exit code (:class:`~servinglab.api.exitcodes.ExitCode`) and a one-line
termination message the operator shows.

The caller must have imported Locust first (see :mod:`servinglab.entry`).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from servinglab import servers
from servinglab.api import ExperimentSpec, SpecError, load_experiment
from servinglab.api.exitcodes import ExitCode
from servinglab.api.results import EffectiveSettings, LoadJobResults, to_json
from servinglab.k8s import sink
from servinglab.k8s.podutilisation import PodUtilisation, UtilisationSource, with_reading_note
from servinglab.loadgen import folder, generators, levels, meeting, shapes, wire
from servinglab.loadgen.payloads import PayloadError, request_payloads
from servinglab.measure.ceiling import ceiling_of
from servinglab.measure.driver import ServerWindows, measure_load
from servinglab.measure.windows import http_fetcher
from servinglab.models.catalogue import request_image_size
from servinglab.servers.base import InferenceGet, Server, reported


@dataclass(frozen=True)
class LoadJobOptions:
    """The `servinglab loadtest` command line."""

    target: str
    model_name: str
    spec_file: Path
    metrics_url: str | None = None
    image_size: int | None = None
    output: Path | None = None
    results_configmap: str | None = None
    ready_timeout: float = 600.0
    flops_per_inference: float | None = None
    payload_dir: Path = Path(".")
    generators_listen: str | None = None
    generators_join: str | None = None
    utilisation_source: str | None = None  # a UtilisationSource's JSON: the operator's, for utilisationTarget


@dataclass(frozen=True)
class Ending:
    """How the Job's pod ends: its exit code and the termination message Kubernetes keeps."""

    code: ExitCode
    message: str


def run(options: LoadJobOptions) -> Ending:
    """The whole program of one load pod."""
    try:
        experiment = load_experiment(options.spec_file)
    except SpecError as exc:
        return Ending(ExitCode.INVALID, str(exc))
    spec = experiment.spec
    try:
        key = _generator_key(spec, options.generators_listen, options.generators_join)
    except ValueError as exc:
        return Ending(ExitCode.GENERATORS_FAILED, str(exc))
    index = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    if index > 0 and options.generators_join and key is not None:  # another load pod: a generator for pod 0
        # the first pod waits for the server (up to ready_timeout) before it takes generators
        problem = _generate_for(options.generators_join, key, options.ready_timeout + 120)
        if problem:
            return Ending(ExitCode.GENERATORS_FAILED, problem)
        return Ending(ExitCode.OK, f"load generator {index + 1} done")
    try:
        target = _target(spec, options)
    except (PayloadError, shapes.TraceError) as exc:
        return Ending(ExitCode.INVALID, str(exc))
    load = spec.load
    answered_at, problem = levels.wait_until_serving(target, load.request_timeout_seconds, options.ready_timeout)
    if problem is not None:
        return Ending(ExitCode.SERVER_NEVER_ANSWERED, problem)
    kind = servers.get(spec.server.kind)
    try:
        pods = _pod_utilisation(spec, options.utilisation_source)
    except ValueError as exc:
        return Ending(ExitCode.INVALID, str(exc))
    windows = ServerWindows(http_fetcher(options.metrics_url), kind.metrics(options.model_name), pods) if (
        options.metrics_url) else None  # fmt: skip
    inference = _getter(target.url, load.request_timeout_seconds)
    effective, refused = _applied(spec, options.model_name, windows, kind, inference)
    if refused is not None:
        return refused
    try:
        remote = _other_generators(spec, options.generators_listen, key, options.ready_timeout)
        measured = measure_load(load, spec.slo.p99_latency_ms, target, windows, remote=remote)
    except generators.GeneratorError as exc:
        return Ending(ExitCode.GENERATORS_FAILED, str(exc))
    except OSError as exc:
        return Ending(ExitCode.METRICS_UNREADABLE, f"reading the server's metrics failed: {exc}")
    flops = options.flops_per_inference
    document = LoadJobResults(
        results=measured.levels,
        effective=effective,
        server_answered_at=answered_at,
        peak_rate=measured.peak_rate,
        utilisation=with_reading_note(measured.utilisation, pods.note if pods is not None else None),
        ceiling=ceiling_of(spec, measured.levels, flops) if spec.ceiling.enabled and flops else None,
    )
    _write_json(to_json(document), options.output)
    if options.results_configmap:
        try:
            sink.write_results(options.results_configmap, to_json(document))
        except sink.SinkError as exc:
            return Ending(ExitCode.RESULTS_NOT_STORED, str(exc))
    summary = f"{len(measured.levels)} levels measured, {measured.requests} requests, {measured.errors} errors"
    return Ending(ExitCode.OK, summary)


def _pod_utilisation(spec: ExperimentSpec, source: str | None) -> PodUtilisation | None:
    """The reading of the server pods' utilisation a utilisation target needs (ValueError: none, or not one)."""
    if spec.load.utilisation_target is None:
        return None
    if source is None:
        raise ValueError("spec.load.utilisationTarget: the Job was given no --utilisation-source to read it from")
    try:
        return PodUtilisation(UtilisationSource.model_validate_json(source))
    except ValidationError as exc:
        raise ValueError(f"--utilisation-source: {exc.errors()[0]['msg']}") from None


def _applied(
    spec: ExperimentSpec, model_name: str, windows: ServerWindows | None, kind: Server, get: InferenceGet
) -> tuple[EffectiveSettings | None, Ending | None]:
    """What the server says it applied, in its metrics or else on its inference port (None where it says
    nothing), or how the Job ends when that is not what the spec asked for: checked before any load is sent."""
    effective, differs = None, None
    if windows is not None:
        try:
            effective, differs = reported(spec.server, windows.metrics, windows.fetch())
        except OSError as exc:
            return None, Ending(ExitCode.METRICS_UNREADABLE, f"reading the server's metrics failed: {exc}")
    if effective is None:
        try:
            effective, differs = kind.applied_settings(spec, model_name, get)
        except (OSError, ValueError) as exc:  # no load is sent to a server whose settings cannot be checked
            return None, Ending(ExitCode.SETTINGS_NOT_APPLIED, f"reading the settings the server applied failed: {exc}")
    return effective, Ending(ExitCode.SETTINGS_NOT_APPLIED, differs) if differs is not None else None


def _getter(base_url: str, timeout: float) -> InferenceGet:
    """GETs on the server's inference port (urllib's HTTPError, an OSError, on an error status)."""

    def get(path: str) -> bytes:
        with urllib.request.urlopen(base_url + path, timeout=timeout) as response:
            body: bytes = response.read()
            return body

    return get


def _target(spec: ExperimentSpec, options: LoadJobOptions) -> levels.Target:
    """Where the load goes and what it sends; a bad payload or trace raises before anything is sent.
    Files are read from the payload folder only, which must itself stay on its volume (a claim's folder
    that is a symlink out of the claim is refused)."""
    load = spec.load
    payload_dir = options.payload_dir
    if load.payload.pvc is not None:
        try:
            payload_dir = folder.within_volume(payload_dir, load.payload.pvc.path, "load.payload.pvc.path")
        except folder.FolderError as exc:
            raise PayloadError(str(exc)) from None
    size = options.image_size or request_image_size(spec.model, load.payload)
    payloads = request_payloads(load.payload, size, payload_dir)
    if load.shape is not None and load.shape.trace is not None:
        shapes.load_trace(load.shape.trace, payload_dir, len(payloads), load.stability.window_seconds)
    kind = servers.get(spec.server.kind)
    path, protocol = kind.request_path(options.model_name), kind.request_protocol(options.model_name)
    return levels.Target(options.target.rstrip("/"), path, payloads, load.payload.check, payload_dir, protocol)


def _generator_key(spec: ExperimentSpec, listen: str | None, join: str | None) -> bytes | None:
    """The key the load pods of one experiment share (a Secret the operator made, in the environment);
    None when this pod runs alone. ValueError, naming the variable, when it is needed and absent."""
    count = spec.load.generators
    if not (listen or join) or not isinstance(count, int) or count == 1:
        return None
    text = os.environ.get(wire.KEY_ENV)
    if not text:
        raise ValueError(
            f"spec.load.generators is {count} but {wire.KEY_ENV} is not set: the load pods need the "
            "experiment's generator key (the operator gives it to them from a Secret) to admit each other"
        )
    return wire.key_from_text(text)


def _other_generators(
    spec: ExperimentSpec, listen: str | None, key: bytes | None, timeout_seconds: float
) -> list[wire.Channel]:
    """The other load pods' generators, once they have joined this (the first) pod."""
    count = spec.load.generators
    if not listen or key is None or not isinstance(count, int):
        return []
    return meeting.accept_generators(_host_port(listen), count - 1, key, timeout_seconds)


def _generate_for(coordinator: str, key: bytes, timeout_seconds: float) -> str | None:
    """Join the first load pod and generate its share of every level; why not, if it failed."""
    try:
        generators.serve(meeting.join_coordinator(_host_port(coordinator), key, timeout_seconds))
    except (generators.GeneratorError, EOFError, OSError) as exc:
        return f"load generator for {coordinator}: {exc}"
    return None


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _write_json(document: dict[str, object], output: Path | None) -> None:
    """To the file, or to stdout when there is none or it is '-' (the Job's log keeps a copy)."""
    text = json.dumps(document, indent=2) + "\n"
    if output is None or str(output) == "-":
        sys.stdout.write(text)
    else:
        output.write_text(text)
