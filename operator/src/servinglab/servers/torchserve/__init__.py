"""TorchServe behind servinglab's seam: the only package that knows TorchServe.

It renders TorchServe's configuration files (:mod:`.config`), packs models as TorchServe no-archive
folders (the built-in models through torch-model-archiver, the user's TorchScript and exported programs
with servinglab's handler, the user's own archives as they are), runs a local TorchServe
(:mod:`.local`), reads its metrics (:mod:`.metrics`), lays out its pod (:mod:`.pod`) and reads a failed
start from its container's termination message. Everything else reaches it through
:func:`servinglab.servers.get`.
"""

from __future__ import annotations

from pathlib import Path

from servinglab.api import ExperimentSpec, ModelRef, Precision, RequestProtocol, ServerSpec
from servinglab.api.ceiling import ModelDescription
from servinglab.api.reasons import Reason
from servinglab.api.servers import capabilities
from servinglab.models import builtins
from servinglab.models.catalogue import request_image_size
from servinglab.servers.base import (
    OUT_OF_MEMORY,
    InferenceGet,
    ModelError,
    PodInputs,
    PodPlan,
    Reported,
    ServedModel,
    container_resources,
)
from servinglab.servers.counters import ModelCounters
from servinglab.servers.torchserve import archive, launcher, metrics, pod
from servinglab.servers.torchserve.local import LocalTorchServe

#: The pinned upstream image a pod runs when the spec names none.
DEFAULT_IMAGE = "pytorch/torchserve:0.12.0-gpu"


class TorchServe:
    """TorchServe 0.12 (the last upstream release)."""

    kind = "torchserve"
    name = "TorchServe"
    capabilities = capabilities("torchserve")
    default_image = DEFAULT_IMAGE

    def request_path(self, model_name: str) -> str:
        return f"/predictions/{model_name}"

    def request_protocol(self, model_name: str) -> RequestProtocol:
        """The payload is the POST body, as it is, with its content type."""
        return RequestProtocol()

    def prepare_model(self, spec: ExperimentSpec, workdir: Path) -> ServedModel:
        """The built-in model laid out from its build (built once, in a child process), or the user's model
        fetched, checked and laid out; a bad source raises :class:`ModelError` with its reason
        (ModelDownloadFailed, ModelChecksumMismatch, ModelNotRecognized, ModelTooLarge,
        PrecisionNotSupported) before any server starts."""
        model = spec.model
        size = request_image_size(model, spec.load.payload)
        target = workdir / "prepared" / model.name
        if model.source is None:
            build = builtins.ensure_built(model.name)
            served = archive.layout_builtin(model.name, build, target, link_weights=True)
            return ServedModel(served, size, builtins.description(model.name, build))
        try:
            prepared = archive.prepare(model, spec.server.precision, target, cache=archive.cache_dir(),
                                       batch_size=spec.server.batch_size)  # fmt: skip
        except archive.ModelSourceError as exc:
            raise ModelError(exc.reason, str(exc)) from None
        return ServedModel(prepared.directory, size, ModelDescription.model_validate(prepared.info))

    def layout_builtin(self, name: str, build: Path, into: Path) -> None:
        """A server pod's copy of a built-in build, laid out where TorchServe serves it."""
        archive.layout_builtin(name, build, into)

    def prepare_user_model(
        self, model: ModelRef, precision: Precision, into: Path, mounted: Path | None, cache: Path | None, count: bool,
        batch_size: int = 1,
    ) -> ModelDescription:  # fmt: skip
        """The user's model fetched, checked and laid out at `into` (a server pod's first init container:
        nothing of the user's runs here without `count`)."""
        try:
            prepared = archive.prepare(model, precision, into, mounted=mounted, cache=cache, count=count,
                                       batch_size=batch_size)  # fmt: skip
        except archive.ModelSourceError as exc:
            raise ModelError(exc.reason, str(exc)) from None
        return ModelDescription.model_validate(prepared.info)

    def local(self, model_name: str, served: Path, spec: ExperimentSpec, workdir: Path, reuse: bool) -> LocalTorchServe:
        return LocalTorchServe(model_name, served, spec.server, workdir, spec.load, model_api=reuse)

    def metrics(self, model_name: str) -> ModelCounters:
        # its metrics do not say its batching (its management API does, inside the pod only)
        return ModelCounters(model_name, metrics.parse, metrics.breakdown)

    def applied_settings(self, spec: ExperimentSpec, model_name: str, get: InferenceGet) -> Reported:
        return None, None  # its management API, which says, is never exposed beyond the pod

    def export_files(self, spec: ExperimentSpec) -> dict[str, str]:
        """config.properties (as a pod serves it), model-config.yaml and metrics.yaml."""
        return pod.config_files(spec)

    def pod(self, spec: ExperimentSpec, inputs: PodInputs) -> PodPlan:
        resources = container_resources(spec.server, inputs.gpu_resource)
        return pod.plan(spec, inputs, self.image(spec.server), resources)

    def start_failure(self, termination_message: str) -> tuple[Reason, str] | None:
        """The launcher ends a container whose workers cannot load the model with "ModelLoadFailed: ...";
        when the handler's exception was CUDA's out-of-memory, the reason is OutOfMemory."""
        reason, _, message = termination_message.strip().partition(": ")
        if reason != launcher.MODEL_LOAD_FAILED:
            return None
        return (OUT_OF_MEMORY if launcher.out_of_memory(message) else Reason.MODEL_LOAD_FAILED), message

    def image(self, server: ServerSpec) -> str:
        return server.image or DEFAULT_IMAGE


TORCHSERVE = TorchServe()
