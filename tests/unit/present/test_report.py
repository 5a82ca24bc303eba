"""`servinglab report`: plots and page from a results document, readable without the JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from servinglab.api.results import to_json
from servinglab.loadgen.stats import Sample, summarise, windows

SERVINGLAB = str(Path(sys.executable).with_name("servinglab"))


def closed_loop_document() -> dict[str, Any]:
    results = []
    for concurrency, latency in ((1, 10.0), (4, 25.0)):
        samples = [Sample(100.0 + i * 0.01, latency + i % 7) for i in range(200)]
        stats = summarise(concurrency, samples)
        entry = stats.to_json()
        entry["server"] = {"queueMsMean": 1.5, "inferenceMsPerBatch": 6.0, "meanBatchSize": 2.0}
        series = [to_json(window.figures()) for window in windows(samples, 100.0, 102.0, 0.5)]
        entry["stability"] = {
            "stable": concurrency == 1,
            "reason": "p99 varies 40% across the last 3",
            "windows": series,
        }
        entry["generator"] = {"saturated": concurrency == 4, "reason": "generator CPU 97% >= 85%"}
        results.append(entry)
    return {
        "experiment": "report-test",
        "model": "tiny",
        "server": {"batchSize": 4, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32"},
        "load": {"mode": "closed-loop"},
        "slo": {"p99LatencyMs": 30},
        "results": results,
        "best": {"concurrency": 4, "throughputRps": results[1]["throughputRps"], "p99LatencyMs": 31.0},
        "ceiling": {
            "flopsPerInference": 3244672,
            "rawAtFormedBatchRps": 5000.0,
            "rawBatchSize": 4,
            "rawBestRps": 8000.0,
            "rawBestBatchSize": 32,
            "rawSkipped": [{"batchSize": 1024, "reason": "one pass would take about 9.0 s, 1.0 s of the budget left"}],
            "accelerator": None,
            "servedOverRaw": 0.02,
            "servedOverBestRaw": 0.0125,
            "note": "no peak figure for this device (CPU)",
        },
    }


def test_report_writes_its_plots_and_a_page_with_the_trust_flags(tmp_path: Path) -> None:
    results_file = tmp_path / "results.json"
    results_file.write_text(json.dumps(closed_loop_document()))
    done = subprocess.run([SERVINGLAB, "report", str(results_file)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "results"
    for name in ("latency-cdf.png", "throughput-p99.png", "server-breakdown.png", "timeseries.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert (out / name).stat().st_size > 10_000, name  # a drawn figure, not an empty canvas
    page = (out / "index.html").read_text()
    assert "report-test" in page and "GENERATOR-LIMITED" in page and "UNSTABLE" in page
    assert "served/raw 0.020" in page and "served/best raw 0.013" in page and "at batch 32" in page
    assert "Raw batch 1024 skipped: one pass would take about 9.0 s" in page
    assert "3.24 GFLOPs" not in page and "0.00324 GFLOPs" in page
    assert page.count("<tr>") == 3  # header + two levels
    # the verdicts (judged here: the document predates them): the best level's in #verdict, each level's in .verdict
    assert '<p id="verdict">Verdict at the best level (4): <b>generator-bound</b>' in page
    assert page.count('<td class="verdict">') == 2 and "<i>try</i>: more load generators" in page
    assert all(f'src="{name}"' in page for name in ("latency-cdf.png", "throughput-p99.png", "timeseries.png"))


def test_report_refuses_a_file_without_results(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"results": []}))
    done = subprocess.run([SERVINGLAB, "report", str(empty)], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "no results to report" in done.stderr
