"""The built-in demo models and what the rest of servinglab needs to know of a model without torch.

Each built-in model is a `model-store/<name>/model.py` exposing `build_model()`, `INPUT_SIZE` and
`NUM_CLASSES`, with weights from a fixed seed (no downloads). Read by the local runner, the load Job (the
size of the images it sends) and the model builds (:mod:`.builtins`). Also here: servinglab's handler
files, which every server runs the models with (`handlers/`), and the file a packed model's declared input
is kept in.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from servinglab import paths
from servinglab.api import ModelInput, ModelRef, PayloadSpec

HANDLER_FILE = "servinglab_image_handler.py"
HANDLER_HELPERS = ("servinglab_imaging.py", "servinglab_datapath.py")
#: The declared input of a packed model (TorchScript, exported program, ONNX), read by servinglab's handler.
INPUT_FILE = "servinglab-input.json"
#: Written into every folder a server lays a user's model out in: what was served and where it came from.
INFO_FILE = "servinglab-model.json"
#: What servinglab runs with its own handler: the formats a model probe can count.
PACKED_FORMATS = ("torchscript", "exported", "onnx")


@dataclass(frozen=True)
class BuiltinModel:
    """A model defined in model-store/ with seeded weights."""

    name: str
    seed: int
    calibration_batches: int
    calibration_batch_size: int
    description: str

    @property
    def source(self) -> Path:
        return paths.model_store_dir() / self.name / "model.py"


BUILTINS: dict[str, BuiltinModel] = {
    "resnet50": BuiltinModel("resnet50", 50, 4, 8, "ResNet-50 architecture, 224x224, 1000 classes"),
    "tiny": BuiltinModel("tiny", 7, 4, 32, "tiny CNN for fast tests, 32x32, 10 classes"),
    "fixed-latency": BuiltinModel(
        "fixed-latency", 11, 1, 1, "a known service time (100 ms a batch), for checking capacity plans, 32x32"
    ),
}


@dataclass(frozen=True)
class ModelInfo:
    """What the runner and load generator need to know about a model without importing torch."""

    name: str
    input_size: int
    num_classes: int


def get_builtin(name: str) -> BuiltinModel:
    try:
        return BUILTINS[name]
    except KeyError:
        raise ValueError(f"unknown built-in model {name!r}; choose one of {', '.join(BUILTINS)}") from None


def load_module(path: Path, name: str | None = None) -> ModuleType:
    """Import a source file that is not on the path (a model definition, a handler helper). It is
    registered in sys.modules while it runs: dataclasses look their module up as they are made."""
    spec = importlib.util.spec_from_file_location(name or f"servinglab_model_{path.parent.name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def model_info(name: str) -> ModelInfo:
    """Input size and class count of a built-in model, read from its source without running it."""
    source = get_builtin(name).source.read_text()
    values: dict[str, int] = {}
    for line in source.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("INPUT_SIZE", "NUM_CLASSES") and value.strip().isdigit():
            values[key.strip()] = int(value.strip())
    return ModelInfo(name, values["INPUT_SIZE"], values["NUM_CLASSES"])


def handler_paths() -> list[Path]:
    """servinglab's handler and its helper module: packed into every archive servinglab makes."""
    return [paths.handlers_dir() / name for name in (HANDLER_FILE, *HANDLER_HELPERS)]


def request_image_size(model: ModelRef, payload: PayloadSpec) -> int:
    """The side of the images the load generates: as the payload says, else what the model takes."""
    if payload.image_size is not None:
        return payload.image_size
    if model.source is None:
        return model_info(model.name).input_size
    return model.input.size if model.input is not None else ModelInput().size
