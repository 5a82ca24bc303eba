"""Triton Inference Server behind servinglab's seam: the only package that knows Triton.

The real `tritonserver` (2.51, as the PyTriton wheel ships it, in an environment of its own: :mod:`.env`)
serves a model repository servinglab writes: config.pbtxt from the spec (:mod:`.config`) and servinglab's
Python model over the model's build (:mod:`.repository`). It runs locally (:mod:`.local`), reads its
metrics (:mod:`.metrics`), lays out its pod (:mod:`.pod`) and speaks the KServe v2 protocol with binary data
(:mod:`.wire`); what it serves is read back from its model configuration endpoint and compared, field by field,
with what servinglab wrote before any load (:meth:`Triton.applied_settings`, and locally
:meth:`.local.LocalTriton.effective`). Its repository API is closed to everyone else: a pod has no model
control, a local server's takes a key only its runner holds. Everything else reaches it through
:func:`servinglab.servers.get`.
"""

from __future__ import annotations

import json
from pathlib import Path

from servinglab.api import ExperimentSpec, ModelRef, Precision, RequestProtocol, ServerSpec
from servinglab.api.ceiling import ModelDescription
from servinglab.api.reasons import Reason
from servinglab.api.servers import capabilities
from servinglab.models import builtins
from servinglab.models.catalogue import request_image_size
from servinglab.models.fetch import ModelSourceError, cache_dir
from servinglab.servers.base import (
    InferenceGet,
    ModelError,
    PodInputs,
    PodPlan,
    Reported,
    ServedModel,
    container_resources,
    not_applied,
)
from servinglab.servers.counters import ModelCounters
from servinglab.servers.triton import config, metrics, native, pod, repository, wire
from servinglab.servers.triton.local import LocalTriton
from servinglab.servers.usermodel import prepare as lay_out_user_model


class Triton:
    """Triton Inference Server 2.51 with servinglab's Python model."""

    kind = "triton"
    name = "Triton"
    capabilities = capabilities("triton")

    def request_path(self, model_name: str) -> str:
        return wire.request_path(model_name)

    def request_protocol(self, model_name: str) -> RequestProtocol:
        """The KServe v2 protocol: the payload is the binary element of the model's BYTES input."""
        return wire.PROTOCOL

    def prepare_model(self, spec: ExperimentSpec, workdir: Path) -> ServedModel:
        """The built-in model's build laid out as a repository entry (built once, in a child process), or the
        user's model fetched, checked and laid out as one (:meth:`prepare_user_model`, counted here)."""
        model = spec.model
        size = request_image_size(model, spec.load.payload)
        target = workdir / "prepared" / model.name
        if model.source is not None:
            described = self.prepare_user_model(model, spec.server.precision, target, None, cache_dir(), True,
                                                spec.server.batch_size)  # fmt: skip
            return ServedModel(target, size, described, packed_directory=repository.user_build(target))
        build = builtins.ensure_built(model.name)
        served = repository.layout_builtin(build, target, link_weights=True)
        # the build lies in the entry's 1/build/: where a form of it is put beside it
        return ServedModel(served, size, builtins.description(model.name, build),
                           packed_directory=repository.user_build(served))  # fmt: skip

    def layout_builtin(self, name: str, build: Path, into: Path) -> None:
        """A server pod's checked copy of a built-in build, moved into its repository entry."""
        repository.layout_builtin(build, into)

    def prepare_user_model(
        self, model: ModelRef, precision: Precision, into: Path, mounted: Path | None, cache: Path | None, count: bool,
        batch_size: int = 1,
    ) -> ModelDescription:  # fmt: skip
        """The user's TorchScript/.pt2 model fetched, checked and laid out as the repository entry `into` (a
        server pod's first init container: nothing of the user's runs here without `count`)."""
        try:
            prepared = lay_out_user_model(model, into, repository.user_layout(model.input), self.name,
                                         self.capabilities.user_model_formats, mounted=mounted, cache=cache,
                                         count=count, precision=precision, batch_size=batch_size)  # fmt: skip
        except ModelSourceError as exc:
            raise ModelError(exc.reason, str(exc)) from None
        return ModelDescription.model_validate(prepared.info)

    def local(self, model_name: str, served: Path, spec: ExperimentSpec, workdir: Path, reuse: bool) -> LocalTriton:
        return LocalTriton(model_name, served, spec.server, workdir, spec.load)

    def metrics(self, model_name: str) -> ModelCounters:
        # its metrics do not say how the model is batched (its repository index and config.pbtxt do)
        return ModelCounters(model_name, metrics.parse, metrics.breakdown)

    def applied_settings(self, spec: ExperimentSpec, model_name: str, get: InferenceGet) -> Reported:
        """The configuration Triton serves (its model configuration endpoint) against the config.pbtxt the pod
        was given, each differing field named; its instances are ready when the model is (strict readiness)."""
        applied = config.read_applied(json.loads(get(wire.config_path(model_name))))
        try:
            get(wire.ready_path(model_name))
            ready = applied.instances
        except OSError:  # not READY (HTTP 400)
            ready = 0
        effective = applied.effective(ready)
        if spec.server.form is not None:  # why the form is not on a native backend of the image's tritonserver
            present = native.image_backends(spec.server.image)
            choice = native.choose_backend(spec.server.form, spec.server.precision, present, wire.PROTOCOL.encoding)
            effective = effective.model_copy(update={"backend_note": choice.reason})
        wanted = config.expected(spec.server, spec.server.gpus, spec.load)
        return effective, config.differences(model_name, wanted, applied) or not_applied(spec.server, effective)

    def export_files(self, spec: ExperimentSpec) -> dict[str, str]:
        """The model's config.pbtxt, as a pod serves it: `<repository>/<model>/config.pbtxt` beside the entry
        `servinglab build-model NAME --into <repository>/<model> --server triton` lays out."""
        return {repository.CONFIG_FILE: pod.config_pbtxt(spec)}

    def pod(self, spec: ExperimentSpec, inputs: PodInputs) -> PodPlan:
        return pod.plan(spec, inputs, self.image(spec.server, inputs), container_resources(spec.server))

    def start_failure(self, termination_message: str) -> tuple[Reason, str] | None:
        """The launcher ends a container whose model Triton cannot load with "ModelLoadFailed: ..."."""
        reason, _, message = termination_message.strip().partition(": ")
        return (Reason.MODEL_LOAD_FAILED, message) if reason == wire.MODEL_LOAD_FAILED else None

    def image(self, server: ServerSpec, inputs: PodInputs) -> str:
        """The spec's image, else the Triton image hack/images.sh builds beside the servinglab image (same
        registry and tag: `<registry>/servinglab/triton:<version>`)."""
        if server.image:
            return server.image
        repository_name, _, tag = inputs.servinglab_image.rpartition(":")
        return f"{repository_name.rpartition('/')[0] or 'servinglab'}/triton:{tag}"


TRITON = Triton()
