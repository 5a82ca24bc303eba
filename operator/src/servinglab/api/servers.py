"""The server under test, as a spec names it: which server (one kind per folder of
:mod:`servinglab.servers`), and the batching, workers, precision, data path (:mod:`.datapath`), placement
and limits it runs with.

Part of the ServingExperiment spec (:mod:`servinglab.api.experiment`); the servers' configuration
renderers and pod builders read it.

What each kind supports is declared here too, once (:data:`CAPABILITIES`): the formats of a user's own model
it serves, the model's forms (`server.form`) and through which path (servinglab's handler, or a native
backend of the server), the data-path settings its workers honour, whether it takes a new configuration in
place, and the worker signals its metrics give the verdict. Spec validation, the sweep's grid, the verdict
and the docs read the declarations without importing a server, and the README's table of them is generated
here (`python -m servinglab.api.servers`; a unit test holds the two equal). A fourth
server is one member of `ServerKind`, one entry of `CAPABILITIES` and its folder.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from servinglab.api.datapath import CompileMode, DataPath
from servinglab.api.forms import GPU_ONLY_FORMS, ModelForm
from servinglab.api.kube import Resources, image_problem, label_key_problem, label_value_problem
from servinglab.api.meta import SpecModel
from servinglab.api.modelref import ModelFormat


class Precision(StrEnum):
    """Numeric precision the handler runs the model in.

    fp32 is strict IEEE fp32 (TF32 explicitly off); tf32 allows TF32 matmuls/convolutions on GPUs
    that have them; fp16 and bf16 convert weights and inputs to that type (not autocast).
    """

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"


class Toleration(SpecModel):
    """A Kubernetes toleration, as in a pod spec, held to the API server's rules for one."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _as_the_api_requires(self) -> Toleration:
        if not self.key and self.operator != "Exists":
            raise ValueError("an empty key matches every taint and needs operator: Exists (operator defaults to Equal)")
        if self.key and (problem := label_key_problem(self.key)):
            raise ValueError(f"key: {problem}")
        if self.operator == "Exists" and self.value:
            raise ValueError(f"value: '{self.value}' must be empty when operator is Exists")
        if self.operator == "Equal" and (problem := label_value_problem(self.value or "")):
            raise ValueError(f"value: {problem}")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect: NoExecute (only NoExecute evicts after a while)")
        return self


#: The most server replicas one experiment may run (a bound against a typo; a plan check needs a handful).
MAX_REPLICAS = 32

#: The model servers servinglab can put under test (each one a folder of :mod:`servinglab.servers`).
ServerKind = Literal["torchserve", "litserve", "triton"]


class WorkerSignal(StrEnum):
    """A figure a server's metrics give about its workers over a window (read by the verdict)."""

    QUEUE = "queue"  # the mean wait before a request's batch starts
    LATENCY = "latency"  # the server's own mean latency per request
    HANDLER_STAGES = "handler-stages"  # servinglab's handler's preprocess, inference and postprocess per batch
    EXECUTION_STAGES = "execution-stages"  # the server's input, execution and output phases per batch
    BATCH = "batch"  # the batches formed, and their mean size


#: Each signal for people (the docs' table).
SIGNAL_WORDS = {
    WorkerSignal.QUEUE: "queue time",
    WorkerSignal.LATENCY: "server latency",
    WorkerSignal.HANDLER_STAGES: "the handler's preprocess/inference/postprocess",
    WorkerSignal.EXECUTION_STAGES: "its input/execution/output phases (decoding counted in execution)",
    WorkerSignal.BATCH: "batches and their size",
}


class ServerCapabilities(BaseModel):
    """One server kind's declaration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The server's name for people ("TorchServe").
    name: str
    #: The formats of a user's own model (`model.source.format`) it serves.
    user_model_formats: tuple[ModelFormat, ...]
    #: The model's forms (`server.form`) it serves, through servinglab's handler.
    forms: tuple[ModelForm, ...] = tuple(ModelForm)
    #: The forms a native backend of the server can run without the handler (form -> backend): where the
    #: server at hand has it and the requests carry the model's input tensor; else the handler serves them.
    native_backends: dict[ModelForm, str] = {}
    #: Whether a running server takes a new configuration without restarting (a local sweep's trials), and how.
    in_place_reconfiguration: bool
    reconfiguration: str
    #: What its metrics say about its workers.
    worker_signals: tuple[WorkerSignal, ...]
    #: The `server.dataPath` settings its workers honour (None: every one, servinglab's handler's).
    data_path_fields: tuple[str, ...] | None = None

    def form_problem(self, kind: str, form: ModelForm | None) -> str | None:
        """Why this server does not serve `form` (naming the fields), or None."""
        if form is None or form in self.forms:
            return None
        served = ", ".join(str(f) for f in self.forms)
        return f"spec.server.form: {self.name} (spec.server.kind: {kind}) does not serve {form}; it serves {served}"

    def data_path_problem(self, kind: str, data_path: DataPath) -> str | None:
        """Why this server does not take `data_path` (the first setting it would ignore, named), or None."""
        if self.data_path_fields is None:
            return None
        default = DataPath()
        for name in DataPath.model_fields:
            value = getattr(data_path, name)
            if name not in self.data_path_fields and value != getattr(default, name):
                taken = ", ".join(f"dataPath.{data_path_key(f)}" for f in self.data_path_fields)
                return (f"spec.server.dataPath.{data_path_key(name)}: {value}: {self.name} (spec.server.kind: "
                        f"{kind}) would ignore it (its model decodes and batches the requests itself); it honours "
                        f"{taken}")  # fmt: skip
        return None

    def format_problem(self, kind: str, fmt: ModelFormat) -> str | None:
        """Why this server does not serve a user's model given as `fmt` (naming the fields), or None (`auto` is
        decided from the file, and refused when the server is prepared)."""
        if fmt is ModelFormat.AUTO or fmt in self.user_model_formats:
            return None
        served = " or ".join(str(f) for f in self.user_model_formats)
        return (f"spec.model.source.format: {self.name} (spec.server.kind: {kind}) does not serve a {fmt} model; "
                f"it serves {served}")  # fmt: skip


_PACKED = (ModelFormat.TORCHSCRIPT, ModelFormat.EXPORTED, ModelFormat.ONNX)
_HANDLER = (WorkerSignal.QUEUE, WorkerSignal.LATENCY, WorkerSignal.HANDLER_STAGES, WorkerSignal.BATCH)

#: Every server kind's declaration, by kind (the members of `ServerKind`, in its order).
CAPABILITIES: dict[str, ServerCapabilities] = {
    "torchserve": ServerCapabilities(
        name="TorchServe",
        # an archive or a model folder brings its own handler, which only TorchServe runs
        user_model_formats=(*_PACKED, ModelFormat.MAR, ModelFormat.DIRECTORY),
        in_place_reconfiguration=True,
        reconfiguration="in place (management API: the model registered again)",
        worker_signals=_HANDLER,
    ),
    "litserve": ServerCapabilities(
        name="LitServe",
        user_model_formats=_PACKED,
        in_place_reconfiguration=False,
        reconfiguration="a restart (no management API)",
        worker_signals=_HANDLER,
    ),
    "triton": ServerCapabilities(
        name="Triton",
        user_model_formats=_PACKED,
        native_backends={
            ModelForm.ONNXRUNTIME: "onnxruntime",
            ModelForm.TORCHSCRIPT: "pytorch",
            ModelForm.TENSORRT: "tensorrt",
        },
        in_place_reconfiguration=True,
        reconfiguration="in place (repository API, with the runner's key: a new config.pbtxt loaded)",
        # its compute counters time the Python model's whole execution (decoding included), not the handler's stages
        worker_signals=(WorkerSignal.QUEUE, WorkerSignal.LATENCY, WorkerSignal.EXECUTION_STAGES, WorkerSignal.BATCH),
        # servinglab's Python model decodes on the CPU, one image at a time, and compiles as asked
        data_path_fields=("compile",),
    ),
}


def data_path_key(name: str) -> str:
    """A `DataPath` field's name as a spec writes it (camelCase)."""
    return DataPath.model_fields[name].alias or name


def capabilities(kind: str) -> ServerCapabilities:
    """The declaration of server `kind`; a kind without one is refused naming the field."""
    found = CAPABILITIES.get(kind)
    if found is None:
        raise ValueError(f"spec.server.kind: {kind!r} is not a server kind ({', '.join(CAPABILITIES)})")
    return found


#: The first line of the README's table of what each server supports.
TABLE_HEADER = ("| kind | user's model formats | forms (`server.form`) | `server.dataPath` | a new configuration "
                "| its workers' signals |")  # fmt: skip


def capabilities_table() -> str:
    """The README's table of what each server supports, from the declarations (markdown, one row per kind)."""
    rows = [TABLE_HEADER, "| --- | --- | --- | --- | --- | --- |"]
    for kind, caps in CAPABILITIES.items():
        formats = ", ".join(f"`{f}`" for f in caps.user_model_formats)
        native = caps.native_backends
        forms = ", ".join(f"`{f}`" + (f" (its `{native[f]}` backend can run it natively)" if f in native else "")
                          for f in caps.forms)  # fmt: skip
        forms += "; through servinglab's handler"
        signals = ", ".join(SIGNAL_WORDS[s] for s in caps.worker_signals)
        fields = caps.data_path_fields
        paths = "every setting" if fields is None else ", ".join(f"`{data_path_key(f)}`" for f in fields) + " only"
        rows.append(f"| `{kind}` ({caps.name}) | {formats} | {forms} | {paths} | {caps.reconfiguration} | {signals} |")
    return "\n".join(rows) + "\n"


class RequestEncoding(StrEnum):
    """How a request body travels to a server: as it is (the payload is the POST body, with its content
    type), or as the one element of a BYTES input tensor of the KServe v2 protocol with binary data (a JSON
    header whose length `Inference-Header-Content-Length` gives, then the element, length-prefixed)."""

    BODY = "body"
    KSERVE_V2_BINARY = "kserve-v2-binary"


class RequestProtocol(SpecModel):
    """What a server kind says about its requests (:meth:`servinglab.servers.base.Server.request_protocol`):
    how the load generator encodes each body (once per body, before any load) and reads the answer. It
    travels to the load generators with their plan; no spec names it."""

    encoding: RequestEncoding = RequestEncoding.BODY
    #: The KServe v2 input tensor the body is the element of.
    input_name: str = Field(default="INPUT", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")


class ServerSpec(SpecModel):
    """The server configuration under test: which server, and its batching, workers and precision."""

    kind: ServerKind = Field(default="torchserve", description="Which model server serves the model.")
    batch_size: int = Field(default=1, ge=1, le=4096, description="The largest batch the server forms.")
    max_batch_delay_ms: int = Field(
        default=50,
        ge=1,
        le=60_000,
        description="How long the server waits to fill a batch, in ms (servers ignore values <= 0: 1 is the minimum).",
    )
    workers: int = Field(default=1, ge=1, le=64, description="Backend worker processes (model copies).")
    precision: Precision = Precision.FP32
    gpus: int = Field(default=1, ge=0, le=16, description="GPUs requested on Kubernetes (0 = CPU).")
    replicas: int = Field(
        default=1, ge=1, le=MAX_REPLICAS,
        description="Server pods behind the experiment's Service, each with `gpus` and `resources` (Kubernetes; "
        "a capacity plan's check runs its replica count). The load is measured against all of them.",
    )  # fmt: skip
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    image: str | None = Field(default=None, description="The server's container image; unset: the server's pinned one.")
    job_queue_size: int = Field(default=1000, ge=1, le=100_000)
    response_timeout_seconds: int = Field(default=300, ge=1, le=3600)
    startup_timeout_seconds: int = Field(default=600, ge=1, le=7200)
    warmup_seconds: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="Time budget of each worker's warm-up before it serves: the batch sizes the load can form "
        "(powers of two) run once each, smallest first, until the next would overrun it. 0 = no warm-up. A "
        "compiled model's sizes run whatever the budget: each compiles its graph, which must not happen measured.",
    )
    data_path: DataPath = Field(
        default_factory=DataPath, description="How the handler decodes, copies and runs a batch (each a sweep axis)."
    )
    form: ModelForm | None = Field(
        default=None,
        description="How the model runs: eager, torchscript, compile (dataPath.compile's mode), onnxruntime or "
        "tensorrt (GPU only); built once, cached and checked against eager fp32. Unset: the model as it comes.",
    )

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, wanted in value.items():
            if problem := label_key_problem(key) or label_value_problem(wanted):
                raise ValueError(problem)
        return value

    @field_validator("image")
    @classmethod
    def _pinned_image(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if problem := image_problem(value):
            raise ValueError(problem)
        last = value.rsplit("/", 1)[-1]
        if "@" not in last and ":" not in last:
            raise ValueError(f"'{value}' has no tag; pin a version (e.g. {value}:1.0)")
        if last.endswith(":latest"):
            raise ValueError(f"'{value}' uses the moving tag 'latest'; pin a version")
        return value

    @model_validator(mode="after")
    def _gpu_paths_need_a_gpu(self) -> ServerSpec:
        if self.gpus == 0 and (needs := self.data_path.gpu_only()):
            raise ValueError(f"dataPath.{needs[0]} needs a GPU, and gpus is 0 (ask for gpus: 1, or use the CPU's "
                             "options: decode: cpu with decodeThreads, compile: default)")  # fmt: skip
        if (problem := self.form_problem() or self.data_path_problem()) is not None:
            raise ValueError(problem)
        return self

    def data_path_problem(self) -> str | None:
        """Why this server kind would ignore a `dataPath` setting (naming it), or None."""
        return capabilities(self.kind).data_path_problem(self.kind, self.data_path)

    def form_problem(self) -> str | None:
        """Why `form` cannot run with the rest of this spec (naming the fields), or None."""
        form = self.form
        if form is None:
            return None
        if (problem := capabilities(self.kind).form_problem(self.kind, form)) is not None:
            return problem
        if self.gpus == 0 and form in GPU_ONLY_FORMS:
            return f"spec.server.form: {form} needs a GPU ({GPU_ONLY_FORMS[form]}), and gpus is 0"
        compiled = self.data_path.compile is not CompileMode.NONE
        if compiled and form is not ModelForm.COMPILE:
            return (f"spec.server.form: {form} and spec.server.dataPath.compile: {self.data_path.compile} contradict "
                    "each other (torch.compile is the form compile: set form: compile, or leave dataPath.compile "
                    "none)")  # fmt: skip
        if form is ModelForm.ONNXRUNTIME and self.precision in (Precision.FP16, Precision.BF16):
            return (f"spec.server.form: onnxruntime runs the exported model at fp32 (tf32 on a GPU), not "
                    f"spec.server.precision: {self.precision}")  # fmt: skip
        return None

    def compile_mode(self) -> CompileMode:
        """The torch.compile mode the handler runs: dataPath.compile's, `default` for form compile left unset."""
        if self.form is ModelForm.COMPILE and self.data_path.compile is CompileMode.NONE:
            return CompileMode.DEFAULT
        return self.data_path.compile


if __name__ == "__main__":
    print(capabilities_table(), end="")
