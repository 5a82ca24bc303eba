"""`make outdated` (hack/outdated.py): which pins have a newer release, without asking the index here."""

from __future__ import annotations

from types import ModuleType

from support.scripts import load_hack_script


def outdated() -> ModuleType:
    return load_hack_script("outdated")


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
