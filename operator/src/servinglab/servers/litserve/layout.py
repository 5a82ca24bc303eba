"""Models as LitServe serves them: a plain folder with the model (a built-in's code and seeded weights),
servinglab's handler files and LitAPI, and `servinglab-serve.json` naming what the LitAPI loads.

Laid out from a built-in model's build locally (the local runner) and in a server pod's init container
(`servinglab build-model NAME --into DIR --server litserve`). No torch here.
"""

from __future__ import annotations

import json
from pathlib import Path

from servinglab import paths
from servinglab.models.builtins import MODEL_FILE, WEIGHTS_FILE, lay_out_build
from servinglab.models.catalogue import handler_paths
from servinglab.servers.litserve.config import API_FILE, SERVE_FILE


def entry_paths() -> list[Path]:
    """servinglab's handler files and its LitAPI: what every LitServe model folder holds beside the model."""
    return [*handler_paths(), paths.handlers_dir() / API_FILE]


def layout_builtin(build: Path, target: Path, link_weights: bool = False) -> Path:
    """A built-in model's build at `target`: the build's files, the entry files and what to load.
    `link_weights` links the weights instead of copying them (a local server's work folder)."""
    lay_out_build(build, target, entry_paths(), link_weights)
    (target / SERVE_FILE).write_text(json.dumps({"serializedFile": WEIGHTS_FILE, "modelFile": MODEL_FILE}))
    return target
