"""The model's form (`server.form`) refused, or built beside the model a server serves, before it starts.

:func:`refusal` says, when the spec is read, why this machine cannot run a form (a GPU-only form with no GPU
visible, a library not installed here, a user's model that cannot take the form), naming the field.
:func:`prepare` builds the form in a child process (:mod:`servinglab.models.formbuild`: torch stays out
of this one), once per content (cached under the model cache), gates it against eager fp32 and puts its
file beside the model (`servinglab-form.pt`, `servinglab-form.onnx`), where the handler loads it. A form
whose output disagrees raises :class:`FormError` with reason `FormDisagrees` and both errors; one whose
export fails, `FormNotBuilt`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from servinglab import paths
from servinglab.api import ServerSpec
from servinglab.api.forms import FORM_DISAGREES, FORM_NOT_BUILT, FormRun, ModelForm
from servinglab.api.reasons import Reason
from servinglab.models.catalogue import INPUT_FILE

#: The file each form with one is served from, beside the model (the handler knows the same names).
FORM_FILES = {ModelForm.TORCHSCRIPT: "servinglab-form.pt", ModelForm.ONNXRUNTIME: "servinglab-form.onnx"}
#: A user's packed model, by its file, and the forms servinglab can build from it ("as it comes" needs none).
_USER_FILES = {"model.pt": "torchscript", "model.pt2": "exported", "model.onnx": "onnx"}
_USER_FORMS = {
    "torchscript": {ModelForm.TORCHSCRIPT: "as it comes", ModelForm.ONNXRUNTIME: "exported"},
    "exported": {ModelForm.EAGER: "as it comes", ModelForm.COMPILE: "compiled"},
    "onnx": {ModelForm.ONNXRUNTIME: "as it comes"},
}


class FormError(RuntimeError):
    """The form cannot be served; `reason` is the condition reason the experiment ends with."""

    def __init__(self, reason: Reason, message: str, run: FormRun | None = None) -> None:
        super().__init__(message)
        self.reason, self.run = reason, run


def cache_dir() -> Path:
    """Where built forms are kept: beside the built-in models' builds (SERVINGLAB_FORMS_DIR moves it)."""
    return Path(os.environ.get("SERVINGLAB_FORMS_DIR") or paths.build_dir() / "forms")


def user_format(folder: Path) -> str | None:
    """The format of the user's model packed in `folder` (torchscript, exported, onnx), or None (a built-in)."""
    return next((fmt for name, fmt in _USER_FILES.items() if (folder / name).is_file()), None)


def refusal(server: ServerSpec, gpus_visible: int, packed_format: str | None = None) -> str | None:
    """Why this machine cannot run `server.form` (naming the field), or None; `packed_format` is a user's
    model's (torchscript, exported, onnx), None for a built-in, or unknown yet."""
    form = server.form
    if form is None:
        return None
    if form is ModelForm.TENSORRT:
        if gpus_visible == 0:
            return "spec.server.form: tensorrt needs a GPU, and none is visible on this machine"
        if importlib.util.find_spec("torch_tensorrt") is None:
            return "spec.server.form: tensorrt needs the Python package torch_tensorrt, not installed here"
        return "spec.server.form: tensorrt is not yet built for serving by servinglab (its raw probe measures it)"
    needs = ("onnx", "onnxruntime") if form is ModelForm.ONNXRUNTIME and packed_format != "onnx" else ()
    if missing := [name for name in needs if importlib.util.find_spec(name) is None]:
        return f"spec.server.form: {form} needs the Python package(s) {', '.join(missing)}, not installed here"
    if packed_format is not None and form not in _USER_FORMS.get(packed_format, {}):
        can = ", ".join(_USER_FORMS.get(packed_format, {})) or "none"
        return f"spec.server.form: {form} cannot be built from a {packed_format} model (it can take: {can})"
    return None


def prepare(server: ServerSpec, folder: Path, batch_sizes: list[int], gpu: bool,
            cache: Path | None = None) -> FormRun | None:  # fmt: skip
    """The form built (or found built), gated and put beside the model in `folder` (the folder the handler
    loads the model from); None for the model as it comes. Raises :class:`FormError`."""
    form = server.form
    packed = user_format(folder)
    if form is None:
        return None
    if packed is None and form is ModelForm.EAGER:
        return FormRun(form=form, backend="torch", precision=str(server.precision), batch_sizes=batch_sizes)
    if (problem := refusal(server, 1 if gpu else 0, packed)) is not None:
        raise FormError(Reason.FORM_NOT_SUPPORTED, problem)
    if packed is not None and _USER_FORMS[packed][form] == "as it comes":
        backend = {"onnx": "onnxruntime", "torchscript": "torchscript"}.get(packed, "torch")
        return FormRun(form=form, backend=backend, precision=str(server.precision), batch_sizes=batch_sizes)
    request: dict[str, object] = {
        "folder": str(folder), "form": str(form), "precision": str(server.precision), "batchSizes": batch_sizes,
        "compile": str(server.compile_mode()), "cacheDir": str(cache or cache_dir()),
        "device": "cuda" if gpu else "cpu",
    }  # fmt: skip
    if form in FORM_FILES:
        request["verifiedFile"] = str(verified_copy(folder, FORM_FILES[form]))
    if packed is None:
        request.update(modelFile="model.py", serializedFile="weights.pt")
    else:
        declared = json.loads((folder / INPUT_FILE).read_text())
        if declared.get("kind") == "tensor" and str(declared.get("dtype", "float32")) not in ("float32", "float16"):
            raise FormError(Reason.FORM_NOT_SUPPORTED, f"spec.server.form: {form} is checked on a float probe "
                            f"batch; this model takes {declared['dtype']} tensors")  # fmt: skip
        shape = declared["shape"] if declared.get("kind") == "tensor" else [3, declared["size"], declared["size"]]
        name = next(name for name, fmt in _USER_FILES.items() if fmt == packed)
        request.update(serializedFile=name, inputShape=shape)
    try:
        return _gated(server, folder, _run_child(request))
    finally:  # the child's copy, where the form failed or the build stopped before it was moved into place
        if form in FORM_FILES:
            verified_copy(folder, FORM_FILES[form]).unlink(missing_ok=True)


def _gated(server: ServerSpec, folder: Path, built: dict[str, object]) -> FormRun:
    """The child's answer read; its gated copy moved into place, or the failure raised."""
    form = server.form
    if "failed" in built:
        raise FormError(FORM_NOT_BUILT, f"spec.server.form: {form} could not be built: {built['failed']}")
    run = FormRun.model_validate(built)
    gate = run.gate
    if gate is not None and not gate.passed:
        raise FormError(
            FORM_DISAGREES,
            f"spec.server.form: {form} disagrees with eager fp32 on the probe batch: largest absolute error "
            f"{gate.max_abs_error:.4g}, largest relative error {gate.max_rel_error:.4g} (tolerance "
            f"{gate.tolerance:g} for {server.precision})", run,
        )  # fmt: skip
    if form in FORM_FILES and built.get("file"):
        placed = folder / FORM_FILES[form]
        # the child's own copy (checked against the signed manifest, then gated): the cache is not read again
        os.replace(str(built["file"]), placed)
    return run


def verified_copy(folder: Path, file: str) -> Path:
    """Where the child copies the form's file to check, gate and then move into place (hidden, beside the model;
    its suffix kept: the loader goes by it)."""
    return folder / f".verified-{file}"


def _run_child(request: dict[str, object]) -> dict[str, object]:
    command = [sys.executable, "-m", "servinglab.models.formbuild", json.dumps(request)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"failed": f"the form's build exited with {done.returncode}: {' | '.join(tail)}"}
    found: dict[str, object] = json.loads(lines[-1])
    return found
