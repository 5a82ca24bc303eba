"""Triton Inference Server behind servinglab's seam: the only package that knows Triton.

The real `tritonserver` (2.51, as the PyTriton wheel ships it, in an environment of its own: :mod:`.env`)
serves a model repository servinglab writes: config.pbtxt from the spec (:mod:`.config`) and servinglab's
Python model over the model's build (:mod:`.repository`). It runs locally (:mod:`.local`), reads its
metrics (:mod:`.metrics`), lays out its pod (:mod:`.pod`) and speaks the KServe v2 protocol with binary data
(:mod:`.wire`). Everything else reaches it through :func:`servinglab.servers.get`.
"""

from __future__ import annotations

from pathlib import Path

from servinglab.api import ExperimentSpec, ModelRef, Precision, RequestProtocol, ServerSpec
from servinglab.api.ceiling import ModelDescription
from servinglab.models import builtins
from servinglab.models.catalogue import BUILTINS, request_image_size
from servinglab.servers.base import ModelError, PodInputs, PodPlan, ServedModel, container_resources
from servinglab.servers.counters import ModelCounters
from servinglab.servers.triton import metrics, pod, repository, wire
from servinglab.servers.triton.local import LocalTriton

#: The reason a user's own model ends with on Triton (only the built-in models are laid out for it so far).
NOT_SUPPORTED = "ModelNotSupported"


class Triton:
    """Triton Inference Server 2.51 with servinglab's Python model."""

    kind = "triton"
    name = "Triton"
    reconfigurable = True  # the repository API loads the model again with a new config.pbtxt

    def request_path(self, model_name: str) -> str:
        return wire.request_path(model_name)

    def request_protocol(self, model_name: str) -> RequestProtocol:
        """The KServe v2 protocol: the payload is the binary element of the model's BYTES input."""
        return wire.PROTOCOL

    def prepare_model(self, spec: ExperimentSpec, workdir: Path) -> ServedModel:
        """The built-in model's build laid out as a repository entry (built once, in a child process)."""
        model = spec.model
        if model.source is not None:
            raise ModelError(NOT_SUPPORTED, _user_models_refused(model))
        build = builtins.ensure_built(model.name)
        served = repository.layout_builtin(build, workdir / "prepared" / model.name, link_weights=True)
        return ServedModel(
            served, request_image_size(model, spec.load.payload), builtins.description(model.name, build)
        )

    def layout_builtin(self, name: str, build: Path, into: Path) -> None:
        """A server pod's checked copy of a built-in build, moved into its repository entry."""
        repository.layout_builtin(build, into)

    def prepare_user_model(
        self, model: ModelRef, precision: Precision, into: Path, mounted: Path | None, cache: Path | None, count: bool
    ) -> ModelDescription:
        raise ModelError(NOT_SUPPORTED, _user_models_refused(model))

    def local(self, model_name: str, served: Path, spec: ExperimentSpec, workdir: Path, reuse: bool) -> LocalTriton:
        return LocalTriton(model_name, served, spec.server, workdir, spec.load)

    def metrics(self, model_name: str) -> ModelCounters:
        # its metrics do not say how the model is batched (its repository index and config.pbtxt do)
        return ModelCounters(model_name, metrics.parse, metrics.breakdown)

    def export_files(self, spec: ExperimentSpec) -> dict[str, str]:
        """The model's config.pbtxt, as a pod serves it: `<repository>/<model>/config.pbtxt` beside the entry
        `servinglab build-model NAME --into <repository>/<model> --server triton` lays out."""
        return {repository.CONFIG_FILE: pod.config_pbtxt(spec)}

    def pod(self, spec: ExperimentSpec, inputs: PodInputs) -> PodPlan:
        return pod.plan(spec, inputs, self.image(spec.server, inputs), container_resources(spec.server))

    def start_failure(self, termination_message: str) -> tuple[str, str] | None:
        """The launcher ends a container whose model Triton cannot load with "ModelLoadFailed: ..."."""
        reason, _, message = termination_message.strip().partition(": ")
        return (reason, message) if reason == wire.MODEL_LOAD_FAILED else None

    def image(self, server: ServerSpec, inputs: PodInputs) -> str:
        """The spec's image, else the Triton image hack/images.sh builds beside the servinglab image (same
        registry and tag: `<registry>/servinglab/triton:<version>`)."""
        if server.image:
            return server.image
        repository_name, _, tag = inputs.servinglab_image.rpartition(":")
        return f"{repository_name.rpartition('/')[0] or 'servinglab'}/triton:{tag}"


def _user_models_refused(model: ModelRef) -> str:
    return (
        f"model {model.name}: Triton serves servinglab's built-in models so far ({', '.join(BUILTINS)});"
        " serve your own model with server.kind: torchserve"
    )


TRITON = Triton()
