"""One experiment, run on this machine and on the test cluster, shows the same table: the same levels
and columns, the same trust warnings, the same best level, peak rate and ceiling lines.

The local run is `servinglab run FILE -o local.json`; the cluster run is the same file applied to the
operator (its server and load Job run by the stand-in kubelet), read back by `servinglab results NAME
-o cluster.json`, which builds its document from the typed status. The measured numbers differ from run
to run, so they are masked; everything else must match. The spec makes a warning certain: the measured
level's two windows, whose p99 must agree within 0.01 %, never do, so it is UNSTABLE with its reason.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.operatorproc import Operator
from servinglab.api.results import ExperimentResults
from servinglab.measure.trust import trust_checks
from servinglab.present import tables

pytestmark = [pytest.mark.k8s, pytest.mark.torchserve]

SERVINGLAB = str(Path(sys.executable).with_name("servinglab"))
NUMBER = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?")


def same_everywhere() -> dict[str, object]:
    """The tiny model on CPU (this machine has no GPU; on the cluster it lands on the CPU node): evenly
    spaced sends at 40 rps in two 3 s windows whose p99 must agree within 0.01 % (120 requests each, so
    p99 is compared: never that close), then a peak-rate search from 10 rps (two probes, too short for
    p99 to be compared: stable); an SLO every level meets, so the same levels pass on a busy machine."""
    document = experiment("same-table", gpus=0, nodeSelector={}, tolerations=[])
    document["spec"]["load"] = {
        "mode": "open", "arrival": "constant", "rates": [40], "warmupSeconds": 1, "durationSeconds": 6,
        "rateSearch": {"minRps": 10, "maxRps": 40, "maxProbes": 2},
        "stability": {"windowSeconds": 3.0, "windows": 2, "tolerance": 0.0001, "maxDurationSeconds": 6},
        # a busy machine must not flag the generator in one run and not the other: nothing it does is flagged
        "generator": {"maxCpuPercent": 100, "maxSendGapMs": 10_000, "maxSendGapShare": 1},
    }  # fmt: skip
    document["spec"]["slo"] = {"p99LatencyMs": 60_000}
    document["spec"]["ceiling"] = {"rawSeconds": 1}
    return document


def shown(document: ExperimentResults) -> tuple[str, list[tuple[str, bool | None, list[str]]], list[str], list[str]]:
    """What the table shows, measured numbers masked: its title; each row's level, SLO verdict and trust
    marks; the warnings under it; the notes (cold start, best level, peak rate, ceiling)."""
    rows = [(level.label, level.meets_slo, trust_checks(level)[0]) for level in document.results]
    warnings = [f"level {level.label}: {why}" for level in document.results for why in trust_checks(level)[1]]
    title = f"{document.experiment}: {document.model} on {document.server.kind} batch={document.server.batch_size}"
    return (
        title,
        rows,
        [NUMBER.sub("#", w) for w in warnings],
        [NUMBER.sub("#", note) for note in tables.notes(document)],
    )


def test_the_same_experiment_shows_the_same_table_locally_and_on_the_cluster(
    tmp_path: Path,
    cluster: Cluster,
    namespace: str,
    operator: Operator,
    kubelet_factory: Callable[..., LocalKubelet],
) -> None:
    kubelet = kubelet_factory()
    spec_file, local_file, cluster_file = tmp_path / "same.yaml", tmp_path / "local.json", tmp_path / "cluster.json"
    spec_file.write_text(json.dumps(same_everywhere()))

    local_run = subprocess.run(
        [SERVINGLAB, "run", str(spec_file), "--output", str(local_file)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert local_run.returncode == 0, local_run.stderr[-3000:]

    cluster.kubectl.apply(same_everywhere(), namespace=namespace)
    body = wait_finished(cluster, namespace, "same-table", operator.log)
    assert condition(body, "Succeeded")["status"] == "True", (body["status"], operator.log(), kubelet.errors)
    read = subprocess.run(
        [SERVINGLAB, "results", "same-table", "-n", namespace, "-o", str(cluster_file)],
        env=cluster.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    shown_by_cli = read.stdout
    assert all(part in shown_by_cli for part in ("warning:", "peak rate within the SLO", "ceiling:")), shown_by_cli

    local = ExperimentResults.model_validate_json(local_file.read_text())
    remote = ExperimentResults.model_validate_json(cluster_file.read_text())
    local_title, local_rows, local_warnings, local_notes = shown(local)
    title, rows, warnings, notes = shown(remote)
    assert (title, rows) == (local_title, local_rows)  # one row per level and probe, the same verdicts and marks
    assert rows == [("40 rps", True, ["UNSTABLE"]), ("10 rps", True, ["stable"]), ("20 rps", True, ["stable"])]
    assert warnings == local_warnings == ["level # rps: unstable after # s: p# varies #% across the last #"]
    assert "warning: level 40 rps: unstable after" in shown_by_cli
    # best level and peak rate: the same sentences; the cold start too, but for the handler's warm-up time,
    # which the server's workers log (a local run reads that log; on a cluster it stays in the server pod)
    assert notes[1:3] == local_notes[1:3] and notes[2].startswith("peak rate within the SLO: # rps")
    assert notes[0] == "cold start # s" and local_notes[0] in ("cold start # s", "cold start # s (handler warm-up # s)")
    # the ceiling: the same FLOPs; the raw figure needs the model alone on the server's device, which only
    # a local run has (the Job has no GPU), and the cluster's line says so instead
    assert notes[3].split(",")[0] == local_notes[3].split(",")[0] == "ceiling: # GFLOPs/inference"
    assert "of the model alone" in local_notes[3] and "measured by local runs" in notes[3]
