"""The model's form (`server.form`) with the tiny model on real servers, CPU: each CPU form built once, found in
the cache the second time (nothing built), gated against eager fp32 and served (LitServe every form,
TorchServe and Triton ONNX Runtime), the results saying what ran; the handler serves the file that was built;
a form whose output disagrees (its cached file changed) ends the run as FormDisagrees with both errors before
any server starts; a GPU-only form on this machine is refused naming the field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from servinglab import servers
from servinglab.api import ExperimentSpec, PayloadFormat, ServerSpec
from servinglab.api.exitcodes import ExitCode
from servinglab.loadgen.payloads import make_payloads
from servinglab.models import digests, forms
from support.manifests import experiment
from support.serving import ready_server
from usermodels import make_user_models

CPU_FORMS = ("eager", "torchscript", "compile", "onnxruntime")


def document(name: str, kind: str, form: str, gpus: int = 0) -> dict[str, Any]:
    return experiment(
        name,
        server={"kind": kind, "gpus": gpus, "batchSize": 4, "maxBatchDelayMs": 5, "warmupSeconds": 5, "form": form,
                "startupTimeoutSeconds": 180},
        load={"concurrency": [2], "warmupSeconds": 1, "durationSeconds": 2, "payload": {"format": "png"}},
        ceiling={"enabled": False},
    )  # fmt: skip


def run(servinglab_cmd: list[str], spec: dict[str, Any], folder: Path, **env: str) -> tuple[str, int, Any]:
    """`servinglab run` with the forms cached under `folder`: (its output, exit code, results or None)."""
    spec_file, output = folder / f"{spec['metadata']['name']}.yaml", folder / "results.json"
    output.unlink(missing_ok=True)
    spec_file.write_text(yaml.safe_dump(spec))
    done = subprocess.run([*servinglab_cmd, "run", str(spec_file), "--output", str(output)], cwd=folder, text=True,
                          capture_output=True, timeout=600, check=False,
                          env={**os.environ, "SERVINGLAB_FORMS_DIR": str(folder / "forms"), **env})  # fmt: skip
    return done.stdout + done.stderr, done.returncode, json.loads(output.read_text()) if output.exists() else None


def served_form(output: str, code: int, results: Any) -> dict[str, Any]:
    assert code == 0, output[-3000:]
    level = results["results"][0]
    assert level["requests"] > 0 and level["errors"] == 0
    form: dict[str, Any] = results["runtime"]["form"]
    return form


def test_each_cpu_form_is_built_once_then_found_in_the_cache(tmp_path: Path) -> None:
    served = servers.get("litserve").prepare_model(ExperimentSpec.model_validate({"model": {"name": "tiny"}}),
                                                   tmp_path / "work")  # fmt: skip
    for form in CPU_FORMS:
        server = ServerSpec(gpus=0, batch_size=4, form=form)
        first = forms.prepare(server, served.packed, [1, 2, 4], gpu=False, cache=tmp_path / "forms")
        entries = {path: path.stat().st_mtime_ns for path in (tmp_path / "forms").rglob("*")}
        second = forms.prepare(server, served.packed, [1, 2, 4], gpu=False, cache=tmp_path / "forms")
        assert first is not None and second is not None
        assert {path: path.stat().st_mtime_ns for path in (tmp_path / "forms").rglob("*")} == entries, (
            f"{form}: the second use built nothing"
        )
        assert (first.form, first.batch_sizes, second.build_seconds) == (form, [1, 2, 4], 0.0)
        if form == "eager":  # the reference itself: nothing to build or gate
            assert (first.backend, first.gate, second.cached) == ("torch", None, False)
            continue
        assert second.cached
        assert not first.cached and first.build_seconds > 0 and first.cache_key == second.cache_key
        assert first.gate is not None and first.gate.passed and first.gate.max_rel_error <= 1e-3
    assert len(list((tmp_path / "forms").iterdir())) == 3, "one entry per form built: torchscript, compile, onnx"


def test_each_cpu_form_is_served_by_litserve_and_the_results_say_what_ran(
    servinglab_cmd: list[str], tmp_path: Path, no_leftover_servers: float
) -> None:
    documents = {form: document(form, "litserve", form) for form in CPU_FORMS}
    documents["compile"]["spec"]["server"]["warmupSeconds"] = 0  # no warm-up asked for: the compiles still run
    outcomes = {form: run(servinglab_cmd, spec, tmp_path) for form, spec in documents.items()}
    ran = {form: served_form(*outcome) for form, outcome in outcomes.items()}
    warmup = outcomes["compile"][2]["runtime"]["warmup"]  # each size the 2 users can form, compiled before serving
    assert (warmup["required"], warmup["batchSizes"], warmup["skipped"]) == ([1, 2], [1, 2], []), warmup
    assert {form: (r["backend"], r.get("provider"), r["precision"], r["batchSizes"]) for form, r in ran.items()} == {
        "eager": ("torch", None, "fp32", [1, 2, 4]),
        "torchscript": ("torchscript", None, "fp32", [1, 2, 4]),
        "compile": ("inductor", None, "fp32", [1, 2, 4]),
        "onnxruntime": ("onnxruntime", "CPUExecutionProvider", "fp32", [1, 2, 4]),
    }
    assert all(not r["cached"] and r["gate"]["passed"] for form, r in ran.items() if form != "eager")
    again = served_form(*run(servinglab_cmd, document("again", "litserve", "onnxruntime"), tmp_path))
    assert again["cached"] and again["buildSeconds"] == 0 and again["cacheKey"] == ran["onnxruntime"]["cacheKey"]


@pytest.mark.parametrize("kind", [pytest.param("torchserve", marks=pytest.mark.torchserve),
                                  pytest.param("triton", marks=pytest.mark.triton)])  # fmt: skip
def test_onnxruntime_is_served_by_torchserve_and_triton(
    kind: str, request: pytest.FixtureRequest, servinglab_cmd: list[str], tmp_path: Path, no_leftover_servers: float
) -> None:
    if kind == "triton":
        request.getfixturevalue("triton_env")
    output, code, results = run(servinglab_cmd, document(kind, kind, "onnxruntime"), tmp_path)
    ran = served_form(output, code, results)
    assert (ran["form"], ran["backend"], ran["provider"], ran["gate"]["passed"]) == (
        "onnxruntime", "onnxruntime", "CPUExecutionProvider", True,
    )  # fmt: skip
    if kind == "triton":  # PyTriton's tritonserver has no onnxruntime backend: Python serves, as Triton says
        from servinglab.servers.triton.env import find_env
        from servinglab.servers.triton.native import present_backends

        assert "python" in present_backends(find_env().backends)
        assert "onnxruntime" not in present_backends(find_env().backends)
        effective = results["server"]["effective"]
        assert (effective["backend"], effective["backendNote"]) == (
            "python",
            "this tritonserver has no onnxruntime backend",
        )


@pytest.mark.triton
def test_the_compiled_form_on_triton_compiles_each_padded_size_before_it_serves(
    triton_env: Any, servinglab_cmd: list[str], tmp_path: Path, no_leftover_servers: float
) -> None:
    """Triton's Python model forms any batch up to its maximum: compiled, it pads them to powers of two as the
    other servers do (one graph each), and compiles every size 3 users can form (padded: 1, 2, 4) before it
    serves, with no warm-up asked for."""
    spec = document("tcomp", "triton", "compile")
    spec["spec"]["server"]["warmupSeconds"] = 0
    spec["spec"]["load"]["concurrency"] = [3]
    output, code, results = run(servinglab_cmd, spec, tmp_path)
    assert served_form(output, code, results)["form"] == "compile"
    warmup = results["runtime"]["warmup"]
    assert (warmup["required"], warmup["batchSizes"], warmup["skipped"]) == ([1, 2, 4], [1, 2, 4], [3]), warmup


class AlwaysSeven(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(torch.nn.functional.one_hot(torch.tensor(7), 10).float() * 20)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        return self.logits + 0 * batch.flatten(1).sum(1, keepdim=True)


def test_the_handler_serves_the_form_that_was_built(tmp_path: Path, no_leftover_servers: float) -> None:
    litserve = servers.get("litserve")
    spec = ExperimentSpec.model_validate(document("ts", "litserve", "torchscript")["spec"])
    served = litserve.prepare_model(spec, tmp_path)
    assert forms.prepare(spec.server, served.packed, [1, 2, 4], gpu=False, cache=tmp_path / "forms") is not None
    # the built file replaced by one that always answers class 7: what is served is that file, not model.py
    always = torch.jit.trace(AlwaysSeven(), torch.zeros(1, 3, 32, 32))  # type: ignore[no-untyped-call]
    torch.jit.save(always, str(served.packed / "servinglab-form.pt"))  # type: ignore[no-untyped-call]
    make = partial(litserve.local, "tiny", served.directory, spec, tmp_path, False)
    with ready_server(make, 180) as (server, _):
        answers = [server.predict(body, "image/png", 30) for body in make_payloads(PayloadFormat.PNG, 32, 3, seed=5)]
    assert [(code, answer["predictions"][0]["class"]) for code, answer in answers] == [(200, 7)] * 3


def test_a_form_that_disagrees_ends_the_run_as_FormDisagrees_with_both_errors(
    servinglab_cmd: list[str], tmp_path: Path, no_leftover_servers: float
) -> None:
    output, code, _ = run(servinglab_cmd, document("ts", "litserve", "torchscript"), tmp_path)
    assert code == 0, output[-3000:]
    (built,) = (tmp_path / "forms").rglob("servinglab-form.pt")
    module = torch.jit.load(str(built))  # type: ignore[no-untyped-call]
    with torch.no_grad():  # a broken export: the last layer's weights off by one
        list(module.parameters())[-2].add_(1.0)
    torch.jit.save(module, str(built))  # type: ignore[no-untyped-call]
    output, code, results = run(servinglab_cmd, document("ts", "litserve", "torchscript"), tmp_path)
    assert code == ExitCode.FAILED and results is None, output[-3000:]
    assert "FormDisagrees: spec.server.form: torchscript disagrees with eager fp32 on the probe batch: largest " \
           "absolute error " in output and ", largest relative error " in output, output[-3000:]  # fmt: skip
    assert "Starting LitServe" not in output


def test_a_gpu_only_form_is_refused_before_anything_is_prepared(servinglab_cmd: list[str], tmp_path: Path) -> None:
    output, code, _ = run(servinglab_cmd, document("trt", "litserve", "tensorrt", gpus=1), tmp_path,
                          CUDA_VISIBLE_DEVICES="")  # fmt: skip
    assert code == ExitCode.FAILED
    assert "FormNotSupported: spec.server.form: tensorrt needs a GPU, and none is visible on this machine" in output
    assert "Preparing model" not in output


def test_a_users_models_take_the_forms_they_can(tmp_path: Path) -> None:
    (tmp_path / "made").mkdir()
    made = make_user_models(tmp_path / "made")
    packed = {}
    for name, source in (("model.pt", made.torchscript_classifier), ("model.onnx", made.onnx_classifier)):
        folder = packed[name] = tmp_path / name
        folder.mkdir()
        shutil.copyfile(source, folder / name)
        (folder / "servinglab-input.json").write_text(json.dumps({"kind": "image", "size": 32}))
    exported = forms.prepare(ServerSpec(gpus=0, form="onnxruntime"), packed["model.pt"], [1, 2], False, tmp_path / "f")
    assert exported is not None and (exported.backend, exported.cached) == ("onnxruntime", False)
    assert (
        exported.gate is not None and exported.gate.passed and (packed["model.pt"] / "servinglab-form.onnx").is_file()
    )
    as_it_comes = forms.prepare(ServerSpec(gpus=0, form="onnxruntime"), packed["model.onnx"], [1], False, tmp_path)
    assert as_it_comes is not None and (as_it_comes.backend, as_it_comes.gate) == ("onnxruntime", None)
    with pytest.raises(forms.FormError) as refused:
        forms.prepare(ServerSpec(gpus=0, form="torchscript"), packed["model.onnx"], [1], False, tmp_path)
    assert refused.value.reason == "FormNotSupported" and "spec.server.form: torchscript cannot be built" in str(
        refused.value
    )


def test_on_a_keyed_cache_a_changed_form_is_built_again_not_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy
    import onnx
    from onnx import numpy_helper

    monkeypatch.setenv("SERVINGLAB_MODEL_CACHE_KEY", "k3y")  # as the server pod's model init container has it
    served = servers.get("litserve").prepare_model(ExperimentSpec.model_validate({"model": {"name": "tiny"}}),
                                                   tmp_path / "work")  # fmt: skip
    server = ServerSpec(gpus=0, batch_size=2, form="onnxruntime")
    first = forms.prepare(server, served.packed, [1, 2], gpu=False, cache=tmp_path / "forms")
    assert first is not None and first.cache_key is not None and not first.cached
    entry = tmp_path / "forms" / first.cache_key
    assert (tmp_path / "forms" / f"{first.cache_key}.manifest.json").is_file(), "signed once whole"
    answers: list[dict[str, object]] = []  # the child's answers, watched on their way (the real child runs)
    child = forms._run_child
    monkeypatch.setattr(forms, "_run_child", lambda request: answers.append(child(request)) or answers[-1])
    assert forms.prepare(server, served.packed, [1, 2], gpu=False, cache=tmp_path / "forms").cached  # type: ignore[union-attr]
    signed = json.loads((tmp_path / "forms" / f"{first.cache_key}.manifest.json").read_text())["files"]
    gated = Path(str(answers[-1]["file"]))  # what the gate loaded: a copy beside the model, not the cache's file
    assert gated.parent == served.packed and (tmp_path / "forms") not in gated.parents
    placed = served.packed / "servinglab-form.onnx"
    assert digests.file_sha256(placed) == signed["servinglab-form.onnx"] and not gated.exists(), "moved into place"
    monkeypatch.setattr(forms, "_run_child", child)
    graph = onnx.load(str(entry / "servinglab-form.onnx"))  # changed by someone without the key
    for initializer in graph.graph.initializer:
        values = numpy_helper.to_array(initializer)
        if values.dtype == numpy.float32:
            initializer.CopyFrom(numpy_helper.from_array(values * 1.5 + 0.25, initializer.name))
    onnx.save(graph, str(entry / "servinglab-form.onnx"))
    again = forms.prepare(server, served.packed, [1, 2], gpu=False, cache=tmp_path / "forms")
    assert again is not None and not again.cached and again.gate is not None and again.gate.passed
