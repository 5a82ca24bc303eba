"""One typed family for results and status: documents written before it existed still read, lose nothing,
and show the same table; a cluster experiment's status shows what a local run's document shows."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from servinglab.api import parse_experiment
from servinglab.api.results import ExperimentResults, LevelResult, Runtime, to_json
from servinglab.api.status import ExperimentStatus, SweepStatus
from servinglab.api.trials import SweepResults, TrialRecord
from servinglab.measure.document import experiment_results
from servinglab.measure.trust import trust_checks
from servinglab.present import tables
from support.manifests import experiment
from support.paths import FIXTURES

OLD = FIXTURES / "v0.1.0"


def without_nulls(value: Any) -> Any:
    """What a document says once fields that are null are left out (they read back as null)."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("results-smoke", ExperimentResults),
        ("results-open", ExperimentResults),
        ("sweep", SweepResults),
        ("trial", TrialRecord),
        ("status-smoke", ExperimentStatus),
        ("status-open", ExperimentStatus),
        ("status-sweep", SweepStatus),
    ],
)
def test_documents_of_the_untyped_version_read_and_lose_nothing(name: str, model: type[BaseModel]) -> None:
    written = json.loads((OLD / f"{name}.json").read_text())
    assert to_json(model.model_validate(written)) == without_nulls(written)


def test_an_old_document_prints_the_same_sentences(capsys: pytest.CaptureFixture[str]) -> None:
    document = ExperimentResults.model_validate_json((OLD / "results-open.json").read_text())
    tables.print_results(document)
    shown = " ".join(capsys.readouterr().out.split())
    assert "peak rate within the SLO: 80 rps" in shown and "3 probes" in shown
    assert "ceiling: 0.00324 GFLOPs/inference" in shown and "of the model alone at the formed batch size" in shown
    assert [level.label for level in document.results] == ["20 rps", "40 rps", "20 rps", "40 rps", "80 rps"]


def cluster_view(document: ExperimentResults) -> ExperimentResults:
    """What `servinglab results` shows of a cluster experiment that measured `document`: the operator keeps
    each level's compact form, the peak rate and the ceiling in the status; the table is rebuilt from it."""
    status = ExperimentStatus(
        results=[level.compact() for level in document.results], peak_rate=document.peak_rate,
        ceiling=document.ceiling, cold_start_seconds=document.cold_start_seconds,
    )  # fmt: skip
    stored = ExperimentStatus.model_validate(json.loads(json.dumps(to_json(status))))  # through the API as JSON
    server = {"batchSize": 4, "maxBatchDelayMs": 5, "gpus": 0}
    spec = parse_experiment(experiment(document.experiment, server=server, slo={"p99LatencyMs": 200})).spec
    return experiment_results(
        document.experiment, spec, stored.results or [], runtime=Runtime(mode="cluster"),
        cold_start_seconds=stored.cold_start_seconds, peak_rate=stored.peak_rate, ceiling=stored.ceiling,
    )  # fmt: skip


def test_a_cluster_status_keeps_every_warning_the_ceiling_and_the_peak_rate(capsys: pytest.CaptureFixture[str]) -> None:
    local = ExperimentResults.model_validate_json((OLD / "results-open.json").read_text())
    second, third = local.results[1], local.results[2]
    assert second.stability is not None and third.generator is not None
    unstable = second.model_copy(update={"stability": second.stability.model_copy(
        update={"stable": False, "reason": "p99 varies 40% across the last 2"})})  # fmt: skip
    limited = third.model_copy(update={"generator": third.generator.model_copy(
        update={"saturated": True, "reason": "generator CPU 97% >= 85%"})})  # fmt: skip
    local = local.model_copy(update={"results": [local.results[0], unstable, limited, *local.results[3:]]})
    cluster = cluster_view(local)
    for ours, theirs in zip(local.results, cluster.results, strict=True):
        assert trust_checks(ours) == trust_checks(theirs)
    assert any("unstable after 3.0 s" in reason for level in cluster.results for reason in trust_checks(level)[1])
    tables.print_results(local)
    local_notes = tables.notes(local)
    tables.print_results(cluster)
    printed = capsys.readouterr().out
    assert printed.count("warning:") == 4  # two warnings, each in both tables
    # best level, peak rate, ceiling: the same words (a local run adds its worker's own precision note)
    assert tables.notes(cluster)[1:4] == local_notes[1:4] and local_notes[1].startswith("best: level")


def test_compact_levels_are_what_the_table_reads() -> None:
    level = ExperimentResults.model_validate_json((OLD / "results-smoke.json").read_text()).results[0]
    compact = level.compact()
    assert compact.latency_cdf_ms is None and compact.stability is not None and compact.stability.windows == []
    kept = to_json(compact)
    assert set(to_json(level)) - set(kept) == {"latencyCdfMs"}
    assert LevelResult.model_validate(kept).latency_ms == level.latency_ms
