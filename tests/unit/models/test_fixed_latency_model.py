"""The fixed-latency built-in model: built like any built-in, served by servinglab's handler, each batch
taking at least its service time whatever its size, and eager only (its other forms are refused)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from servinglab.api import ExperimentSpec, PayloadFormat
from servinglab.loadgen.payloads import make_payloads
from servinglab.models import catalogue
from servinglab.models.builtins import COUNTS_FILE
from support.handler import handler_for, rows

MODEL = "fixed-latency"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, servinglab_cmd: list[str]) -> Path:
    """The model laid out for TorchServe, as a server pod's init container does."""
    build_dir, into = tmp_path_factory.mktemp("build"), tmp_path_factory.mktemp("served") / MODEL
    subprocess.run([*servinglab_cmd, "build-model", MODEL, "--build-dir", str(build_dir), "--into", str(into)],
                   check=True)  # fmt: skip
    return into


def service_seconds() -> float:
    module = catalogue.load_module(catalogue.get_builtin(MODEL).source)
    return float(module.SERVICE_MS) / 1000


def test_it_is_a_builtin_with_a_small_input_and_almost_no_compute(served: Path) -> None:
    assert catalogue.model_info(MODEL) == catalogue.ModelInfo(MODEL, 32, 10)
    counts = json.loads((served / COUNTS_FILE).read_text())
    assert counts["parameters"] == 3 * 10 + 10
    assert counts["flopsPerInference"] < 1000


@pytest.mark.parametrize("size", [1, 4])
def test_each_batch_takes_at_least_the_service_time_whatever_its_size(served: Path, size: int) -> None:
    handler, context = handler_for(served, "fp32")
    images = make_payloads(PayloadFormat.JPEG, 32, size, seed=1)
    begun = time.perf_counter()
    answers = handler.handle(rows(*images), context)
    took = time.perf_counter() - begun
    assert len(answers) == size and all(json.loads(answer) for answer in answers)
    assert took >= service_seconds()  # a lower bound only: a slower host takes longer, never shorter
    assert context.metrics.values["ServinglabInferenceMs"][0] >= service_seconds() * 1000


@pytest.mark.parametrize(
    ("server", "field"),
    [({"form": "torchscript"}, "server.form"), ({"form": "onnxruntime"}, "server.form"),
     ({"form": "compile"}, "server.form"), ({"dataPath": {"compile": "default"}}, "server.dataPath.compile")],
)  # fmt: skip
def test_forms_other_than_eager_are_refused_naming_the_field(server: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=rf"{field}: .*runs eager only"):
        ExperimentSpec.model_validate({"model": {"name": MODEL}, "server": {"gpus": 0, **server}})
    # the same settings are fine for another built-in
    ExperimentSpec.model_validate({"model": {"name": "tiny"}, "server": {"gpus": 0, **server}})


def test_eager_is_accepted() -> None:
    spec = ExperimentSpec.model_validate({"model": {"name": MODEL}, "server": {"gpus": 0, "form": "eager"}})
    assert spec.server.form == "eager"
