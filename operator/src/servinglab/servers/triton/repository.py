"""A built-in model laid out as a Triton model repository entry:

    <model>/config.pbtxt             rendered from the experiment (:mod:`.config`), written per experiment
    <model>/1/model.py               servinglab's Python model (handlers/servinglab_triton_model.py)
    <model>/1/servinglab_imaging.py  the decoding and precision code every server runs (handlers/)
    <model>/1/build/                 the model's checked build: its model.py and seeded weights, its counts

Called by the local Triton's model preparation and, in a server pod's init container, by `servinglab
build-model --into <repository>/<model> --server triton` (the build is copied there, checked against its
digests, then moved into `1/build/`). A user's TorchScript file or exported program is laid out the same way
(:func:`user_layout`, through :mod:`servinglab.servers.usermodel`): `1/build/` holds `model.pt`/`model.pt2`
and its declared input (`servinglab-input.json`), and servinglab's Python model then runs the handler's own
`load()` and `run()` (as TorchServe and LitServe do) and answers with the handler's JSON (one BYTES output,
ANSWER). An archive with its own handler is refused with ModelNotSupported before anything starts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from servinglab import paths
from servinglab.api import ModelFormat, ModelInput, ModelSource
from servinglab.models.builtins import WEIGHTS_FILE
from servinglab.models.catalogue import HANDLER_FILE, HANDLER_HELPERS, INPUT_FILE
from servinglab.models.fetch import Fetched
from servinglab.servers.triton.config import VERSION
from servinglab.servers.usermodel import LayOut, Staged, stage_packed

#: servinglab's Triton model, in handlers/.
MODEL_SOURCE = "servinglab_triton_model.py"
CONFIG_FILE = "config.pbtxt"
BUILD_DIR = "build"


def model_files() -> list[Path]:
    """The files of servinglab's Python model: the entry point, the handler (a user's model runs its `load()`
    and `run()`) and the shared handler helpers."""
    names = (MODEL_SOURCE, HANDLER_FILE, *HANDLER_HELPERS)
    return [paths.handlers_dir() / name for name in names]


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
    _copy_model_files(version)
    return target


def _copy_model_files(version: Path) -> None:
    for source in model_files():
        shutil.copyfile(source, version / ("model.py" if source.name == MODEL_SOURCE else source.name))


def user_build(entry: Path) -> Path:
    """Where a user's model lies in its repository entry (counted, described and measured alone there)."""
    return entry / VERSION / BUILD_DIR


def user_layout(model_input: ModelInput | None) -> LayOut:
    """How the user's fetched TorchScript/.pt2 file is laid out at a target: the file and its declared input
    in `1/build/` (where it is counted and described), servinglab's model beside it."""

    def lay_out(source: ModelSource, fetched: Fetched, fmt: ModelFormat, target: Path) -> Staged:
        build = user_build(target)
        stage_packed(fetched, fmt, build, model_input)
        _copy_model_files(target / VERSION)
        return Staged(build)

    return lay_out


def packed_folder(target: Path) -> Path:
    """Where a repository entry's model is: the folder the probe counts."""
    return target / VERSION / BUILD_DIR


def serves_user_model(target: Path) -> bool:
    """Whether the entry at `target` is a user's packed model (answered with the handler's JSON)."""
    return (packed_folder(target) / INPUT_FILE).is_file()
