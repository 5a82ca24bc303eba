"""Where servinglab finds its own files (model definitions, handlers) and where it writes builds.

The package lives in `operator/src/servinglab/` of the project checkout (installed editable) or in a
container image laid out the same way; `SERVINGLAB_HOME` overrides the checkout root, and
`SERVINGLAB_BUILD_DIR` where built model archives go. Used by the model store and the local runner.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The checkout root: the folder holding model-store/ and handlers/."""
    override = os.environ.get("SERVINGLAB_HOME")
    if override:
        return Path(override).resolve()
    return Path(__file__).resolve().parents[3]


def model_store_dir() -> Path:
    """model-store/: one folder per built-in model with its `model.py`."""
    return project_root() / "model-store"


def handlers_dir() -> Path:
    """handlers/: the TorchServe handler and its helper module, packed into every archive."""
    return project_root() / "handlers"


def build_dir() -> Path:
    """Where `servinglab build-model` writes archives (git-ignored, never committed)."""
    override = os.environ.get("SERVINGLAB_BUILD_DIR")
    return Path(override).resolve() if override else model_store_dir() / "build"
