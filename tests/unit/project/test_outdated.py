"""`make outdated` (hack/outdated.py): which pins have a newer release, without asking the index here."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from support.paths import ROOT

SCRIPT = ROOT / "hack" / "outdated.py"


def outdated() -> ModuleType:
    spec = importlib.util.spec_from_file_location("outdated", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_name_pinned_in_two_places_is_listed_when_either_pin_is_behind() -> None:
    script = outdated()
    assert script.newer("2.4.6 / 1.26.4", "2.4.6"), (
        "the Triton environment's numpy is behind though the main one is not"
    )
    assert script.newer("1.26.4", "2.4.6")
    assert not script.newer("2.4.6", "2.4.6")
    assert not script.newer("2.4.6 / 2.4.6", "2.4.6")


def test_every_exact_pin_of_the_project_and_the_triton_environment_is_read() -> None:
    found = outdated().pins()
    assert {"torch", "pytest", "ruff", "numpy"} <= set(found)
    assert "triton-env" in found["numpy"].where and "project" in found["numpy"].where
