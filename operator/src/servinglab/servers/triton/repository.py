"""A built-in model laid out as a Triton model repository entry:

    <model>/config.pbtxt             rendered from the experiment (:mod:`.config`), written per experiment
    <model>/1/model.py               servinglab's Python model (handlers/servinglab_triton_model.py)
    <model>/1/servinglab_imaging.py  the decoding and precision code every server runs (handlers/)
    <model>/1/build/                 the model's checked build: its model.py and seeded weights, its counts

Called by the local Triton's model preparation and, in a server pod's init container, by `servinglab
build-model --into <repository>/<model> --server triton` (the build is copied there, checked against its
digests, then moved into `1/build/`). Only built-in models so far: the user's own models are refused with
a reason before anything starts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from servinglab import paths
from servinglab.models.builtins import WEIGHTS_FILE
from servinglab.models.catalogue import HANDLER_HELPERS
from servinglab.servers.triton.config import VERSION

#: servinglab's Triton model, in handlers/.
MODEL_SOURCE = "servinglab_triton_model.py"
CONFIG_FILE = "config.pbtxt"
BUILD_DIR = "build"


def model_files() -> list[Path]:
    """The files of servinglab's Python model: the entry point and the shared handler helpers."""
    return [paths.handlers_dir() / MODEL_SOURCE, *(paths.handlers_dir() / name for name in HANDLER_HELPERS)]


def layout_builtin(build: Path, target: Path, link_weights: bool = False) -> Path:
    """The build at `target/1/build` (moved there when `build` is `target` itself, a pod's checked copy;
    else copied, the weights linked with `link_weights`) and servinglab's model beside it."""
    version = target / VERSION
    into = version / BUILD_DIR
    in_place = build.resolve() == target.resolve()
    if in_place:
        staged = target.parent / f".{target.name}-build"
        shutil.rmtree(staged, ignore_errors=True)
        target.rename(staged)
        version.parent.mkdir(parents=True)
        version.mkdir()
        staged.rename(into)
    else:
        shutil.rmtree(target, ignore_errors=True)
        into.mkdir(parents=True)
        for entry in build.iterdir():
            if link_weights and entry.name == WEIGHTS_FILE:
                (into / entry.name).symlink_to(entry.resolve())
            elif entry.is_file():
                shutil.copyfile(entry, into / entry.name)
    for source in model_files():
        shutil.copyfile(source, version / ("model.py" if source.name == MODEL_SOURCE else source.name))
    return target
