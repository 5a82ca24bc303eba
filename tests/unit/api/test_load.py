"""What a spec may ask the load to produce and read is bounded, and a spec past a bound is refused
naming the field, its value and the way back inside: stability windows (each one a record of the
results the operator reads whole), burst phases, and paths of payload and trace files."""

from __future__ import annotations

from typing import Any

import pytest

from servinglab.api import SpecError, parse_experiment
from servinglab.api.load import MAX_WINDOWS, MAX_WINDOWS_PER_LEVEL
from support.manifests import experiment


def problems(load: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_experiment(experiment("bounds", load=load))
    return info.value.problems


def test_a_window_of_a_millisecond_is_refused_naming_the_field_and_value() -> None:
    assert problems({"stability": {"windowSeconds": 0.001}}) == [
        "spec.load.stability.windowSeconds: 0.001 is below the minimum 0.05"
    ]


@pytest.mark.parametrize(
    ("load", "expected"),
    [
        # one level of an hour in 0.1 s windows: 36,000 windows
        ({"concurrency": [1], "durationSeconds": 3600, "stability": {"windowSeconds": 0.1}},
         "spec.load: stability.windowSeconds: 0.1 s windows over a level measured up to 3600 s are 36000 windows; "
         f"at most {MAX_WINDOWS_PER_LEVEL} per level (windowSeconds >= 0.36)"),
        # the extension counts: measured up to maxDurationSeconds
        ({"concurrency": [1], "durationSeconds": 60, "stability": {"windowSeconds": 0.5, "maxDurationSeconds": 7200}},
         "a level measured up to 7200 s are 14400 windows"),
        # 64 levels of 10 minutes in 0.5 s windows: 1,200 each, 76,800 in all
        ({"concurrency": list(range(1, 65)), "durationSeconds": 600, "stability": {"windowSeconds": 0.5}},
         f"over 64 levels of up to 600 s are 76800 windows; at most {MAX_WINDOWS} in all (windowSeconds >= 0.768"),
        # the peak-rate search's probes are levels too
        ({"mode": "open", "rates": [10.0] * 32, "durationSeconds": 600, "stability": {"windowSeconds": 0.5},
          "rateSearch": {"minRps": 1, "maxRps": 100, "maxProbes": 32}},
         "over 64 levels of up to 600 s are 76800 windows"),
        # a step run is one level as long as all its steps
        ({"mode": "open", "shape": {"step": {"rates": [1, 2, 3, 4], "stepSeconds": 3600}},
          "stability": {"windowSeconds": 1}},
         "a level measured up to 14400 s are 14400 windows; at most 10000 per level"),
        # a burst every 0.2 s for two hours: 72,000 phases
        ({"mode": "open", "shape": {"burst": {"baseRps": 1, "burstRps": 2, "burstSeconds": 0.1, "periodSeconds": 0.2,
                                              "durationSeconds": 7200}}, "stability": {"windowSeconds": 1}},
         "spec.load: shape.burst.periodSeconds: 0.2 s periods over 7200 s are up to 72000 phases; at most 2000 "
         "(periodSeconds >= 7.2)"),
    ],
    ids=["per-level", "extension", "in-all", "probes", "step", "burst-phases"],
)  # fmt: skip
def test_too_many_windows_or_phases_are_refused_with_the_window_that_would_fit(
    load: dict[str, Any], expected: str
) -> None:
    found = problems(load)
    assert any(expected in problem for problem in found), found


def test_the_defaults_and_long_legitimate_runs_stay_inside() -> None:
    for load in (
        {},  # 3 levels of 60 s in 5 s windows
        {"concurrency": list(range(1, 65)), "durationSeconds": 3600},  # 64 hours-long levels, 5 s windows
        {"concurrency": [1, 2], "durationSeconds": 60, "stability": {"windowSeconds": 0.05}},  # 1,200 windows each
        {"mode": "open", "shape": {"burst": {"baseRps": 1, "burstRps": 9, "burstSeconds": 1, "periodSeconds": 10,
                                             "durationSeconds": 7200}}, "stability": {"windowSeconds": 1}},
    ):  # fmt: skip
        parse_experiment(experiment("bounds", load=load))


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"files": ["/var/run/secrets/kubernetes.io/serviceaccount/token"]}, "must be a relative path"),
        ({"records": "../records.jsonl"}, "'../records.jsonl' must be a relative path inside the payload folder"),
        ({"files": [".."], "configMap": "bodies"}, "'..' must be a relative path"),
    ],
)
def test_payload_files_outside_the_payload_folder_are_refused(payload: dict[str, Any], expected: str) -> None:
    found = problems({"payload": payload})
    assert any(problem.startswith("spec.load.payload: ") and expected in problem for problem in found), found


def test_a_trace_outside_the_payload_folder_is_refused() -> None:
    for file in ("/etc/passwd", "traces/../../x.csv"):
        found = problems({"mode": "open", "shape": {"trace": {"file": file}}})
        assert any(p.startswith("spec.load.shape.trace.file: ") and "must be a relative path" in p for p in found)
