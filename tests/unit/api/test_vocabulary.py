"""One vocabulary: condition reasons and states are enum members, the README's table of failures and the
CRDs' state enums are generated from them, and the wire format is the plain strings it always was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servinglab.api import conditions as cond
from servinglab.api.crd import crd_manifest, sweep_crd_manifest
from servinglab.api.reasons import FAILURE_TABLE_HEADER, Reason, failure_table
from servinglab.api.states import Confidence, ConfirmationState, ExperimentState, SweepState, TrialState
from servinglab.k8s.experiment.diagnose import model_init_failure

# the repository root, wherever under tests/ this file is
README = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists()) / "README.md"


def _readme_table() -> str:
    lines = README.read_text().splitlines()
    start = lines.index(FAILURE_TABLE_HEADER)
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return "\n".join(lines[start:end]) + "\n"


def test_the_readmes_table_of_failures_is_the_one_the_reasons_generate() -> None:
    assert _readme_table() == failure_table(), "regenerate it: python -m servinglab.api.reasons"


def test_every_failure_says_what_happened_and_what_is_kept_and_no_value_is_spelled_twice() -> None:
    failures = [reason for reason in Reason if reason.fails]
    assert len(failures) >= 30 and all(reason.happened and reason.kept for reason in failures)
    assert Reason.FORM_DISAGREES in failures and Reason.WAITING_FOR_GPU not in failures
    values = [reason.value for reason in Reason]
    assert len(values) == len(set(values)) and all(value[0].isupper() and " " not in value for value in values)


def _status(manifest: dict[str, object]) -> dict[str, object]:
    version = manifest["spec"]["versions"][0]  # type: ignore[index]
    return version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]  # type: ignore[no-any-return]


def test_the_crds_list_the_states_the_enums_define() -> None:
    experiment, sweep = _status(crd_manifest()), _status(sweep_crd_manifest())
    assert experiment["summary"]["properties"]["state"]["enum"] == list(ExperimentState)  # type: ignore[index]
    summary = sweep["summary"]["properties"]  # type: ignore[index]
    assert summary["state"]["enum"] == list(SweepState)
    assert summary["winner"]["enum"] == list(Confidence) and summary["winner"]["nullable"] is True
    assert sweep["trials"]["items"]["properties"]["state"]["enum"] == list(TrialState)  # type: ignore[index]
    assert sweep["confirmation"]["properties"]["state"]["enum"] == list(ConfirmationState)  # type: ignore[index]
    # a condition's reason stays text: one an older operator wrote still reads back
    assert "enum" not in experiment["conditions"]["items"]["properties"]["reason"]  # type: ignore[index]


def test_a_member_is_written_as_its_plain_string() -> None:
    conditions = cond.set_condition([], cond.FAILED, True, Reason.INVALID_SPEC, "spec.load: bad")
    written = json.loads(json.dumps([c.model_dump(mode="json", by_alias=True) for c in conditions]))
    assert written[0]["reason"] == "InvalidSpec" and type(written[0]["reason"]) is str
    read = cond.Condition.model_validate({"type": "Failed", "status": "True", "reason": "SomethingOlder"})
    assert read.reason == "SomethingOlder"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("ModelTooLarge: 17 GiB read; model.source.maxBytes is 16 GiB", Reason.MODEL_TOO_LARGE),
        ("FormDisagrees: torchscript disagrees with eager fp32", Reason.FORM_DISAGREES),
        ("NoSuchReason: what a newer image might say", Reason.MODEL_PREPARATION_FAILED),
        ("ServerCrashed: a reason, but not one the model init container ends with", Reason.MODEL_PREPARATION_FAILED),
    ],
)
def test_an_init_containers_reason_is_read_as_the_member_it_names(message: str, reason: Reason) -> None:
    pod = {
        "metadata": {"name": "exp-server-0"},
        "status": {
            "initContainerStatuses": [{"name": "model", "state": {"terminated": {"exitCode": 3, "message": message}}}]
        },
    }
    found = model_init_failure([pod])
    assert found is not None and found[0] is reason
