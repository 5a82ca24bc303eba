"""The model's form: how the model runs inside the server (`server.form`), and what ran (`runtime.form`).

A form is eager PyTorch, TorchScript (traced), `torch.compile` (the mode is `server.dataPath.compile`'s;
`default` when unset), ONNX Runtime (with the execution provider the device has) or TensorRT (GPU only).
servinglab builds the form once before the server starts, keyed by content (the model's digest, the form,
the precision, the batch sizes and the library versions), checks it against eager fp32 on a fixed probe
batch, and the handler serves what was built (:mod:`servinglab.models.forms`). A form that disagrees ends
the experiment as `FormDisagrees`, with the largest absolute and relative error.
"""

from __future__ import annotations

from enum import StrEnum

from servinglab.api.meta import ResultModel
from servinglab.api.reasons import Reason

#: The reason an experiment ends with when its form's output disagrees with eager fp32 beyond the tolerance.
FORM_DISAGREES = Reason.FORM_DISAGREES
#: The reason when the form cannot be built (an export that fails) or run here (a missing library).
FORM_NOT_BUILT, FORM_NOT_SUPPORTED = Reason.FORM_NOT_BUILT, Reason.FORM_NOT_SUPPORTED


class ModelForm(StrEnum):
    """How the model runs: `eager` PyTorch, `torchscript` (traced), `compile` (torch.compile), `onnxruntime`
    (ONNX Runtime: the CPU's execution provider, CUDA's on a GPU) or `tensorrt` (GPU only)."""

    EAGER = "eager"
    TORCHSCRIPT = "torchscript"
    COMPILE = "compile"
    ONNXRUNTIME = "onnxruntime"
    TENSORRT = "tensorrt"


#: Each form's short, DNS-safe mark in a sweep's trial names (distinct from the data path's marks).
FORM_LABELS = {ModelForm.EAGER: "eager", ModelForm.TORCHSCRIPT: "ts", ModelForm.COMPILE: "tcomp",
               ModelForm.ONNXRUNTIME: "ort", ModelForm.TENSORRT: "trt"}  # fmt: skip

#: The forms that need a GPU, and why.
GPU_ONLY_FORMS = {ModelForm.TENSORRT: "TensorRT runs on NVIDIA GPUs only"}


class FormGate(ResultModel):
    """The form's output on the fixed probe batch against eager fp32: the largest absolute error, and that
    error relative to the largest absolute value of the reference's output, against the precision's tolerance."""

    max_abs_error: float
    max_rel_error: float
    tolerance: float
    passed: bool


class FormRun(ResultModel):
    """What ran: the form, its backend (torch, torchscript, inductor, onnxruntime), the execution provider,
    the precision, the batch sizes it was built and checked at, the build's seconds (0 when the cache had it)
    and whether the cache had it, and the gate."""

    form: ModelForm
    backend: str
    provider: str | None = None
    precision: str
    batch_sizes: list[int]
    build_seconds: float = 0.0
    cached: bool = False
    cache_key: str | None = None
    gate: FormGate | None = None
