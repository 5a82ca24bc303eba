"""LitServe behind servinglab's seam: the only package that knows LitServe.

LitServe (PyPI `litserve`) is a library, not a server binary: servinglab starts it with a script rendered
from the spec (:mod:`.config`) around its own LitAPI (`handlers/servinglab_litserve_api.py`, which runs the
same handler code as TorchServe), lays models out as plain folders (:mod:`.layout`), runs it locally
(:mod:`.local`), reads the LitAPI's counters (:mod:`.metrics`) and lays out its pod (:mod:`.pod`).
Everything else reaches it through :func:`servinglab.servers.get`.

It serves servinglab's built-in models and a user's own TorchScript file or exported program (`model.source`,
with servinglab's handler, as every server); an archive with its own handler is refused with ModelNotSupported,
before anything starts.
"""

from __future__ import annotations

from pathlib import Path

from servinglab.api import ExperimentSpec, ModelRef, Precision, RequestProtocol, ServerSpec
from servinglab.api.ceiling import ModelDescription
from servinglab.api.figures import ServerBreakdown
from servinglab.api.reasons import Reason
from servinglab.api.results import EffectiveSettings
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
)
from servinglab.servers.litserve import layout, metrics, pod
from servinglab.servers.litserve.config import API_PATH, MODEL_LOAD_FAILED
from servinglab.servers.litserve.local import LocalLitServe
from servinglab.servers.usermodel import prepare as lay_out_user_model

#: The image a pod runs when the spec names none (hack/images.sh builds it; pinned to this release).
DEFAULT_IMAGE = "servinglab/litserve:0.1.0"


class LitServeMetrics:
    """servinglab's LitAPI counters, read at a window's edges, and the settings its workers report."""

    def snapshot(self, text: str) -> object:
        return metrics.parse(text)

    def breakdown(self, before: object, after: object) -> ServerBreakdown:
        assert isinstance(before, dict) and isinstance(after, dict)
        return metrics.breakdown(before, after)

    def effective(self, text: str) -> EffectiveSettings | None:
        return metrics.effective(metrics.parse(text))


class LitServe:
    """LitServe 0.2 with servinglab's LitAPI."""

    kind = "litserve"
    name = "LitServe"
    capabilities = capabilities("litserve")
    default_image = DEFAULT_IMAGE

    def request_path(self, model_name: str) -> str:
        return API_PATH

    def request_protocol(self, model_name: str) -> RequestProtocol:
        """The payload is the POST body, as it is, with its content type (as TorchServe's)."""
        return RequestProtocol()

    def prepare_model(self, spec: ExperimentSpec, workdir: Path) -> ServedModel:
        """The built-in model laid out from its build (built once, in a child process), or the user's model
        fetched, checked and laid out (:meth:`prepare_user_model`, counted here)."""
        model = spec.model
        size = request_image_size(model, spec.load.payload)
        target = workdir / "prepared-litserve" / model.name
        if model.source is not None:
            described = self.prepare_user_model(model, spec.server.precision, target, None, cache_dir(), True,
                                                spec.server.batch_size)  # fmt: skip
            return ServedModel(target, size, described)
        build = builtins.ensure_built(model.name)
        served = layout.layout_builtin(build, target, link_weights=True)
        return ServedModel(served, size, builtins.description(model.name, build))

    def layout_builtin(self, name: str, build: Path, into: Path) -> None:
        layout.layout_builtin(build, into)

    def prepare_user_model(
        self, model: ModelRef, precision: Precision, into: Path, mounted: Path | None, cache: Path | None, count: bool,
        batch_size: int = 1,
    ) -> ModelDescription:  # fmt: skip
        """The user's model fetched, checked and laid out at `into` (a server pod's first init container:
        nothing of the user's runs here without `count`); raises :class:`ModelError`."""
        try:
            prepared = lay_out_user_model(model, into, layout.user_layout(model.input), self.name,
                                         self.capabilities.user_model_formats, mounted=mounted, cache=cache,
                                         count=count, precision=precision, batch_size=batch_size)  # fmt: skip
        except ModelSourceError as exc:
            raise ModelError(exc.reason, str(exc)) from None
        return ModelDescription.model_validate(prepared.info)

    def local(self, model_name: str, served: Path, spec: ExperimentSpec, workdir: Path, reuse: bool) -> LocalLitServe:
        return LocalLitServe(model_name, served, spec, workdir)

    def metrics(self, model_name: str) -> LitServeMetrics:
        return LitServeMetrics()

    def applied_settings(self, spec: ExperimentSpec, model_name: str, get: InferenceGet) -> Reported:
        return None, None  # its metrics say (LitServeMetrics.effective)

    def export_files(self, spec: ExperimentSpec) -> dict[str, str]:
        """server.py: the script that starts LitServe with this configuration (beside the model folder)."""
        return pod.config_files(spec)

    def pod(self, spec: ExperimentSpec, inputs: PodInputs) -> PodPlan:
        return pod.plan(spec, inputs, self.image(spec.server), container_resources(spec.server))

    def start_failure(self, termination_message: str) -> tuple[Reason, str] | None:
        """A worker that cannot load the model ends the container with "ModelLoadFailed: ..."."""
        reason, _, message = termination_message.strip().partition(": ")
        return (Reason.MODEL_LOAD_FAILED, message) if reason == MODEL_LOAD_FAILED else None

    def image(self, server: ServerSpec) -> str:
        return server.image or DEFAULT_IMAGE


LITSERVE = LitServe()
