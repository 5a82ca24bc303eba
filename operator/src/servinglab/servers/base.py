"""The seam between servinglab and a model server: what every server kind provides, taken from the
places servinglab uses a server.

A server kind (one folder of :mod:`servinglab.servers`) gives:

* how requests reach it (:meth:`Server.request_path`) and how a body is encoded and its answer read
  (:meth:`Server.request_protocol`: data the load generator acts on, knowing no server);
* its model, packed (:meth:`Server.prepare_model`: the built-in models and the user's own);
* a local server process (:meth:`Server.local` -> :class:`LocalServer`: start, ready when every worker
  has the model, reconfigure when the server can, stop, effective settings, metrics text, notes);
* its metrics read into the typed breakdown (:meth:`Server.metrics` -> :class:`ServerMetrics`);
* the settings it says it applied, checked against the spec before any load: in its metrics
  (:meth:`ServerMetrics.effective`) or through its inference port (:meth:`Server.applied_settings`);
* on Kubernetes, its configuration files and pod parts, and how to read a failed start
  (:mod:`servinglab.servers.base` keeps them neutral: plain manifests, reasons and messages);
* the files that deploy a winning configuration (:meth:`Server.export_files`).

The local runner, the load Job, the operator and the sweep reach a server only through :func:`get`
(:mod:`servinglab.servers`) and these protocols, so a new server is one new folder.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servinglab.api import ExperimentSpec, LoadSpec, ModelRef, Precision, RequestProtocol, ServerSpec
from servinglab.api.ceiling import ModelDescription
from servinglab.api.figures import ServerBreakdown
from servinglab.api.forms import FormRun, ModelForm
from servinglab.api.reasons import Reason
from servinglab.api.results import DataPathRun, EffectiveSettings, Warmup
from servinglab.api.servers import ServerCapabilities

#: A Kubernetes object or a part of one (a container, a volume), as the API takes it.
Manifest = dict[str, Any]
#: The server pod's init containers every server has: `model` puts the model in place (its termination
#: message is the model's description, or "<Reason>: <message>" when it cannot be served); `probe`
#: counts a user's model (it loads it, so it sees nothing but the model store, read-only); `form` builds a
#: user's model's `server.form` beside it (it loads it too: no cache, claim or credentials).
MODEL_INIT, PROBE_INIT, FORM_INIT = "model", "probe", "form"
#: The reason a server's start failure carries when the model does not fit its device's memory (a sweep
#: prunes every larger configuration on it: servinglab.sweep.search).
OUT_OF_MEMORY = Reason.OUT_OF_MEMORY


class ServerError(RuntimeError):
    """A server failed to start, crashed, or answered unexpectedly; the message says which (and starts
    with a reason, such as `ModelLoadFailed: ...`, where one is known)."""


class PortTaken(ServerError):
    """The server exited because a port picked free for it was bound by another process first: the pick and
    the server's own bind are seconds apart. The local runner starts it again on other ports, at most
    :data:`PORT_ATTEMPTS` starts."""

    def __init__(self, server: str, code: int | None, said: str, logs: Path) -> None:
        super().__init__(f"{server} exited with code {code}: {said} (a port picked free for it was bound by "
                         f"another process first); logs in {logs}")  # fmt: skip
        self.server, self.said = server, said


#: Starts of a local server, each on other free ports, before a port taken at every start ends the run: a
#: port is picked free seconds before the server binds it, and on a busy machine another process may bind it
#: first.
PORT_ATTEMPTS = 3


class ModelError(RuntimeError):
    """The model cannot be served; `reason` is the condition reason the experiment ends with."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


#: What a server kind supports, declared once (:data:`servinglab.api.servers.CAPABILITIES`, which spec
#: validation and the sweep's grid read too): its preparation of a user's model refuses a format outside it
#: with ModelNotSupported before anything starts; the local runner reconfigures in place where it says so.
Capabilities = ServerCapabilities


@dataclass(frozen=True)
class ServedModel:
    """What a server serves: its prepared folder, the image side the load generates, and what the model
    is (parameters, FLOPs; for the user's model, where it came from)."""

    directory: Path
    image_size: int
    description: ModelDescription
    #: Where a user's packed model (model.pt/.pt2 beside its declared input) lies, when not `directory`
    #: itself (Triton keeps it in the repository entry's `1/build/`): what the ceiling measures alone.
    packed_directory: Path | None = None
    #: The model's form as built, gated and placed beside the model (`server.form`), for the results.
    form: FormRun | None = None
    #: The `server.form` it was prepared for (a server reused for another form is prepared anew).
    form_spec: ModelForm | None = None

    @property
    def packed(self) -> Path:
        return self.packed_directory or self.directory


@dataclass(frozen=True)
class PodPlan:
    """What the operator needs to run one experiment's server in a pod: besides these, the operator's
    own builders add identity, labels, owner, the GPU request, node selector and tolerations."""

    #: Files rendered from the spec, into the experiment's ConfigMap (mounted at `config_dir`).
    config_files: dict[str, str]
    config_dir: str
    init_containers: list[Manifest]
    containers: list[Manifest]
    volumes: list[Manifest]
    run_as_user: int
    inference_port: int
    metrics_port: int
    metrics_path: str


#: The extended resource GPUs are requested as unless the operator is told another (MIG, other vendors).
GPU_RESOURCE = "nvidia.com/gpu"


def container_resources(server: ServerSpec, gpu_resource: str = GPU_RESOURCE) -> Manifest:
    """A server container's requests and limits: the spec's, and the GPUs it asks for."""
    limits: dict[str, str] = dict(server.resources.limits)
    if server.gpus:
        limits[gpu_resource] = str(server.gpus)
    resources: Manifest = {"limits": limits} if limits else {}
    if server.resources.requests:
        resources["requests"] = dict(server.resources.requests)
    return resources


def restricted(read_only_root: bool = True) -> Manifest:
    """A container security context of the `restricted` Pod Security Standard."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


#: How often the kubelet checks a server that is starting, then running (seconds).
PROBE_PERIOD_SECONDS = 10


def liveness_probes(check: Manifest, startup_timeout_seconds: int) -> Manifest:
    """The container's `startupProbe` and `livenessProbe`, both running `check` (an httpGet, tcpSocket or exec).
    The startup probe allows the whole `server.startupTimeoutSeconds` (the operator's own limit, which ends the
    experiment as ServerNotReady with its reason) before the liveness probe counts: a server whose workers
    warm up or compile for minutes (Triton opens its HTTP port only once every model has loaded) is not
    restarted by the kubelet while it starts."""
    return {
        "startupProbe": {**check, "periodSeconds": PROBE_PERIOD_SECONDS,
                         "failureThreshold": math.ceil(startup_timeout_seconds / PROBE_PERIOD_SECONDS) + 1},
        "livenessProbe": {**check, "periodSeconds": PROBE_PERIOD_SECONDS},
    }  # fmt: skip


def size_limit(size: int) -> str:
    """An emptyDir's sizeLimit for `size` bytes, in whole MiB."""
    return f"{math.ceil(size / 2**20)}Mi"


@dataclass(frozen=True)
class PodInputs:
    """What the operator gives a server's pod: its ConfigMap, the servinglab image (the model-building
    init container), the model cache claim (if the chart names one), the experiment's file name in
    the ConfigMap, the resource its GPUs are requested as, the Secret of the model URL whose query
    string the ConfigMap does not hold, and the Secret of the key that signs the model cache's manifests."""

    config_map: str
    servinglab_image: str
    model_cache_claim: str | None = None
    experiment_file: str = "experiment.yaml"
    gpu_resource: str = GPU_RESOURCE
    model_url_secret: str | None = None
    model_cache_key_secret: str | None = None


@dataclass(frozen=True)
class RuntimeNotes:
    """What the server's workers said about how they run: the precision's realisation, the data path, the
    warm-up."""

    precision_note: str | None = None
    data_path: DataPathRun | None = None
    warmup: Warmup | None = None


class ServerMetrics(Protocol):
    """A server's metrics text, read at a window's edges, and the breakdown between two reads."""

    def snapshot(self, text: str) -> object: ...

    def breakdown(self, before: object, after: object) -> ServerBreakdown: ...

    def effective(self, text: str) -> EffectiveSettings | None:
        """The settings the server says in its metrics that it runs with (None: its metrics do not say;
        TorchServe's management API does, and it is never exposed beyond the pod). The load Job checks
        them before it sends load."""
        ...


#: A GET of a path on the server's inference port (its body); OSError (urllib's HTTPError too) when it fails.
InferenceGet = Callable[[str], bytes]
#: What a server says it applied (None where it does not say), and why that is not what the spec asked for
#: (None when it is, or when nothing is said).
Reported = tuple[EffectiveSettings | None, str | None]


def reported(server: ServerSpec, metrics: ServerMetrics, text: str) -> Reported:
    """What the server says in its metrics `text` that it applied (None where they do not say), and why that
    is not what the spec asked for (None when it is, or when nothing is said)."""
    effective = metrics.effective(text)
    return effective, not_applied(server, effective) if effective is not None else None


def not_applied(server: ServerSpec, effective: EffectiveSettings) -> str | None:
    """Why the server's own report differs from what the spec asked for (batch size, delay, ready
    workers), or None: checked before any load is sent, locally and in the load Job."""
    requested = (server.batch_size, server.max_batch_delay_ms, server.workers)
    applied = (effective.batch_size, effective.max_batch_delay_ms, effective.ready_workers)
    if requested == applied:
        return None
    return (
        "the server did not apply the requested settings (batchSize, maxBatchDelayMs, workers): "
        f"requested {requested}, in effect {applied}"
    )


class LocalServer(Protocol):
    """One server process on this machine serving one model (the local runner's and the tests')."""

    model_name: str
    workdir: Path
    gpus: int

    @property
    def inference_url(self) -> str: ...

    @property
    def request_path(self) -> str: ...

    def start(self) -> None: ...

    def wait_ready(self, timeout_seconds: float) -> float:
        """Block until every worker has loaded the model; the seconds since start (the cold start)."""
        ...

    def reconfigure(self, server: ServerSpec, load: LoadSpec | None) -> float:
        """Apply another configuration: in place where the server can (`capabilities.in_place_reconfiguration`),
        else by restarting it from the model it already has; the seconds until every worker was ready."""
        ...

    def stop(self) -> None: ...

    def check_alive(self) -> None:
        """Raise :class:`ServerError` when the server has died."""
        ...

    def predict(self, body: bytes, content_type: str, timeout: float) -> tuple[int, Any]:
        """One request: (HTTP status, parsed answer)."""
        ...

    def effective(self) -> EffectiveSettings:
        """What the server says it applied (batch size, delay, ready workers)."""
        ...

    def metrics_text(self) -> str: ...

    def notes(self) -> RuntimeNotes: ...

    def worker_process_ids(self) -> list[int]:
        """The processes that run the model now (the workers): the CPU they use, or wait for, is the model's."""
        ...


class Server(Protocol):
    """One kind of model server."""

    kind: str
    #: The server's name for people ("TorchServe").
    name: str
    #: What it supports (its entry of :data:`servinglab.api.servers.CAPABILITIES`): a user's model's
    #: formats, the forms, whether it takes a new configuration in place, its workers' signals.
    capabilities: Capabilities

    def request_path(self, model_name: str) -> str: ...

    def request_protocol(self, model_name: str) -> RequestProtocol:
        """How the load generator encodes a body for this server and reads its answer."""
        ...

    def prepare_model(self, spec: ExperimentSpec, workdir: Path) -> ServedModel:
        """The experiment's model packed for this server (locally); raises :class:`ModelError` with its
        reason before any server starts."""
        ...

    def layout_builtin(self, name: str, build: Path, into: Path) -> None:
        """A built-in model's (checked) build at `into`, laid out as this server serves it."""
        ...

    def prepare_user_model(
        self, model: ModelRef, precision: Precision, into: Path, mounted: Path | None, cache: Path | None, count: bool,
        batch_size: int = 1,
    ) -> ModelDescription:  # fmt: skip
        """The user's model fetched, checked and laid out at `into` for `precision` and batches of up to
        `batch_size` (an ONNX model's batch dimension is checked against it); raises :class:`ModelError`."""
        ...

    def local(self, model_name: str, served: Path, spec: ExperimentSpec, workdir: Path, reuse: bool) -> LocalServer:
        """A (not yet started) local server of `served`; with `reuse` it can be reconfigured."""
        ...

    def metrics(self, model_name: str) -> ServerMetrics: ...

    def applied_settings(self, spec: ExperimentSpec, model_name: str, get: InferenceGet) -> Reported:
        """What the server says on its inference port that it runs with, checked against the spec (the load
        Job does before it sends load; Triton's model configuration endpoint). (None, None) where it says
        nothing there: TorchServe's management API is never exposed beyond the pod, LitServe's metrics say."""
        ...

    def export_files(self, spec: ExperimentSpec) -> dict[str, str]:
        """The files that deploy this configuration in production, by name."""
        ...

    def pod(self, spec: ExperimentSpec, inputs: PodInputs) -> PodPlan:
        """The server's pod, as the operator deploys it (pure)."""
        ...

    def start_failure(self, termination_message: str) -> tuple[Reason, str] | None:
        """(reason, message) when a server container's termination message says why the server gave up
        (e.g. ModelLoadFailed; :data:`OUT_OF_MEMORY` when the model did not fit the GPU), else None."""
        ...
