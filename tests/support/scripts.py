"""The repository's scripts (hack/*.py) loaded as modules, for the tests of their functions."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from support.paths import ROOT


def load_hack_script(name: str) -> ModuleType:
    """hack/<name>.py as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "hack" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
