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

from servinglab import models, modelsource
from servinglab.api import ExperimentSpec, ServerSpec
from servinglab.api.results import ModelDescription, ServerBreakdown
from servinglab.servers.torchserve.local import LocalTorchServe
from servinglab.servers.base import ModelError, PodInputs, PodPlan, ServedModel, container_resources
from servinglab.servers.torchserve import launcher, metrics, pod

#: The pinned upstream image a pod runs when the spec names none.
DEFAULT_IMAGE = "pytorch/torchserve:0.12.0-gpu"


class TorchServeMetrics:
    """TorchServe's Prometheus counters of one model, read at a window's edges."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def snapshot(self, text: str) -> object:
        return metrics.parse(text, self.model_name)

    def breakdown(self, before: object, after: object) -> ServerBreakdown:
        assert isinstance(before, dict) and isinstance(after, dict)
        return metrics.breakdown(before, after)


class TorchServe:
    """TorchServe 0.12 (the last upstream release)."""

    kind = "torchserve"
    reconfigurable = True  # the management API registers the model again with new settings
    default_image = DEFAULT_IMAGE

    def request_path(self, model_name: str) -> str:
        return f"/predictions/{model_name}"

    def prepare_model(self, spec: ExperimentSpec, workdir: Path) -> ServedModel:
        """The built-in model's archive (built once, in a child process), or the user's model fetched,
        checked and packed; a bad source raises :class:`ModelError` with its reason (ModelDownloadFailed,
        ModelChecksumMismatch, ModelNotRecognized, ModelTooLarge, PrecisionNotSupported) before any server
        starts."""
        model = spec.model
        size = models.request_image_size(model, spec.load.payload)
        if model.source is None:
            archive = models.ensure_built(model.name)
            return ServedModel(archive, size, ModelDescription.model_validate(models.description(model.name, archive)))
        try:
            prepared = modelsource.prepare(
                model, spec.server.precision, workdir / "prepared" / model.name, cache=modelsource.cache_dir()
            )
        except modelsource.ModelSourceError as exc:
            raise ModelError(exc.reason, str(exc)) from None
        return ServedModel(prepared.directory, size, ModelDescription.model_validate(prepared.info))

    def local(
        self, model_name: str, served: Path, spec: ExperimentSpec, workdir: Path, reuse: bool
    ) -> LocalTorchServe:
        return LocalTorchServe(model_name, served, spec.server, workdir, spec.load, model_api=reuse)

    def metrics(self, model_name: str) -> TorchServeMetrics:
        return TorchServeMetrics(model_name)

    def export_files(self, spec: ExperimentSpec) -> dict[str, str]:
        """config.properties (as a pod serves it), model-config.yaml and metrics.yaml."""
        return pod.config_files(spec)

    def pod(self, spec: ExperimentSpec, inputs: PodInputs) -> PodPlan:
        return pod.plan(spec, inputs, self.image(spec.server), container_resources(spec.server))

    def start_failure(self, termination_message: str) -> tuple[str, str] | None:
        """The launcher ends a container whose workers cannot load the model with "ModelLoadFailed: ..."."""
        reason, _, message = termination_message.strip().partition(": ")
        return (reason, message) if reason == launcher.MODEL_LOAD_FAILED else None

    def image(self, server: ServerSpec) -> str:
        return server.image or DEFAULT_IMAGE


TORCHSERVE = TorchServe()
