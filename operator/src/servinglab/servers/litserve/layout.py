"""Models as LitServe serves them: a plain folder with the model (a built-in's code and seeded weights, or
the user's TorchScript/.pt2 file beside its declared input), servinglab's handler files and LitAPI, and
`servinglab-serve.json` naming what the LitAPI loads.

Laid out from a built-in model's build locally (the local runner) and in a server pod's init container
(`servinglab build-model NAME --into DIR --server litserve`); the user's model by
:mod:`servinglab.servers.usermodel` with :func:`lay_out_user` (`servinglab prepare-model` in a pod). No torch
here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from servinglab import paths
from servinglab.api import ModelFormat, ModelInput, ModelSource
from servinglab.models.builtins import MODEL_FILE, WEIGHTS_FILE, lay_out_build
from servinglab.models.catalogue import handler_paths
from servinglab.models.fetch import Fetched
from servinglab.servers.litserve.config import API_FILE, SERVE_FILE
from servinglab.servers.usermodel import LayOut, Staged, stage_packed


def entry_paths() -> list[Path]:
    """servinglab's handler files and its LitAPI: what every LitServe model folder holds beside the model."""
    return [*handler_paths(), paths.handlers_dir() / API_FILE]


def layout_builtin(build: Path, target: Path, link_weights: bool = False) -> Path:
    """A built-in model's build at `target`: the build's files, the entry files and what to load.
    `link_weights` links the weights instead of copying them (a local server's work folder)."""
    lay_out_build(build, target, entry_paths(), link_weights)
    (target / SERVE_FILE).write_text(json.dumps({"serializedFile": WEIGHTS_FILE, "modelFile": MODEL_FILE}))
    return target


def user_layout(model_input: ModelInput | None) -> LayOut:
    """How the user's fetched TorchScript/.pt2 file is laid out at a target: the file and its declared input
    (loaded by the handler's own `load()`, as on every server), the entry files and what to load."""

    def lay_out(source: ModelSource, fetched: Fetched, fmt: ModelFormat, target: Path) -> Staged:
        serialized = stage_packed(fetched, fmt, target, model_input)
        for entry in entry_paths():
            shutil.copyfile(entry, target / entry.name)
        (target / SERVE_FILE).write_text(json.dumps({"serializedFile": serialized}))
        return Staged(target)

    return lay_out
