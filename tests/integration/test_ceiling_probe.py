"""The raw ceiling measures what the server ran, within its budget, and stops when asked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml

from servinglab.measure import ceiling
from servinglab.measure.raw import probe as rawprobe
from servinglab.measure.raw.figures import RawCache

pytestmark = pytest.mark.torchserve

SMOKE = Path(__file__).resolve().parents[2] / "examples" / "experiment-smoke.yaml"


def probes_alive(mark: str | None = None) -> list[psutil.Process]:
    """Running raw-throughput probes (and their watchdogs); with `mark`, only those whose environment
    carries it as PROBE_MARK (other tests may run probes on this machine at the same time)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if "servinglab.measure.raw.child" not in " ".join(proc.info["cmdline"] or []):
            continue
        if mark is not None:
            try:
                if proc.environ().get(PROBE_MARK) != mark:
                    continue
            except psutil.Error:  # gone, or a zombie
                continue
        found.append(proc)
    return found


PROBE_MARK = "SERVINGLAB_PROBE_MARK"


def test_probe_at_batch_1024_keeps_to_its_budget_and_reuses_what_it_measured() -> None:
    sizes = ceiling.scan_batch_sizes(8, 1024)
    cache = RawCache()
    messages: list[str] = []
    started = time.monotonic()
    figures = rawprobe.measure("tiny", "fp32", "cpu", sizes, 2.0, messages.append, cache)
    wall = time.monotonic() - started
    assert figures.device == "cpu" and 8 in figures.measured
    # every size is either measured or skipped with a reason; the formed size comes first
    assert set(figures.measured) | set(figures.skipped) == set(sizes)
    assert messages[0] == "Ceiling: model alone at batch 8"
    longest_pass = max(row.pass_seconds for row in figures.measured.values())
    # the budget bounds the measuring: at most one pass (plus a first pass per size) beyond it
    assert figures.measure_seconds <= 2.0 + 2 * longest_pass + 0.5, figures
    # the setup reported is the parent's view (start-up and imports included) and the two parts fit in the wall
    # time; how long the rest takes depends on the host, so it is a benchmark's figure (docs/benchmarks.md § 4)
    assert figures.setup_seconds > 0 and figures.setup_seconds + figures.measure_seconds <= wall, (figures, wall)
    for reason in figures.skipped.values():
        assert "of the budget left" in reason or "GiB" in reason

    again = rawprobe.measure("tiny", "fp32", "cpu", sizes, 2.0, messages.append, cache)
    assert again.from_cache == sorted(figures.measured) and again.measure_seconds == 0.0
    assert again.measured == figures.measured  # no second child: the sweep's trials share these rows


def test_a_batch_that_cannot_fit_in_memory_is_skipped_before_allocating_it() -> None:
    figures = rawprobe.measure("tiny", "fp32", "cpu", [10_000_000, 4], 1.0)
    assert "GiB for activations" in figures.skipped[10_000_000] and "GiB free" in figures.skipped[10_000_000]
    assert figures.measured[4].throughput_rps > 0


def test_batch_1024_run_measures_the_ceiling_at_the_formed_batch_and_warms_up_what_the_load_forms(
    servinglab_cmd: list[str], tmp_path: Path, no_leftover_servers: float
) -> None:
    document = yaml.safe_load(SMOKE.read_text())
    document["metadata"]["name"] = "tiny-b1024"
    document["spec"]["server"].update(batchSize=1024, maxBatchDelayMs=10, workers=1)
    document["spec"]["load"].update(concurrency=[1, 8], warmupSeconds=1, durationSeconds=3)
    document["spec"]["ceiling"] = {"rawSeconds": 3}
    experiment, output = tmp_path / "b1024.yaml", tmp_path / "b1024.json"
    experiment.write_text(yaml.safe_dump(document))
    run = subprocess.run(
        [*servinglab_cmd, "run", str(experiment), "--output", str(output)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(output.read_text())
    # the handler warmed the sizes 8 users can form, not every power of two up to 1024
    warmup = results["runtime"]["warmup"]
    assert warmup["batchSizes"] == [1, 2, 4, 8] and warmup["skipped"] == []
    assert 0 < results["warmupSeconds"] < results["coldStartSeconds"]
    figures = results["ceiling"]
    served = max(results["results"], key=lambda level: level["throughputRps"])
    formed, batches = served["server"]["meanBatchSize"], served["server"]["batches"]
    # at most 8 in flight; the two counters (batches, requests batched) are sampled while batches are being
    # recorded, so each end of the window can hold one batch's requests without its count
    assert formed <= 8 + 2 * 8 / batches and figures["formedBatchSizeMean"] == formed
    assert figures["rawBatchSize"] == max(1, round(formed))
    at_formed = next(row for row in figures["rawTable"] if row["batchSize"] == figures["rawBatchSize"])
    assert figures["rawAtFormedBatchRps"] == at_formed["throughputRps"] > 0
    assert figures["servedOverRaw"] == pytest.approx(figures["servedRps"] / figures["rawAtFormedBatchRps"], rel=1e-3)
    best = max(figures["rawTable"], key=lambda row: row["throughputRps"])
    assert (figures["rawBestBatchSize"], figures["rawBestRps"]) == (best["batchSize"], best["throughputRps"])
    assert figures["servedOverBestRaw"] == pytest.approx(figures["servedRps"] / figures["rawBestRps"], rel=1e-3)
    longest_pass = max(row["passSeconds"] for row in figures["rawTable"])
    assert figures["rawMeasureSeconds"] <= 3 + 2 * longest_pass + 0.5
    printed = " ".join(run.stdout.split())  # the console wraps long lines
    assert "of the model alone at the formed batch size" in printed and "of its best" in printed


def test_interrupting_the_ceiling_stops_its_probe_at_once(
    servinglab_cmd: list[str], tmp_path: Path, no_leftover_servers: float
) -> None:
    document = yaml.safe_load(SMOKE.read_text())
    document["spec"]["load"].update(concurrency=[2], warmupSeconds=0, durationSeconds=1)
    document["spec"]["ceiling"] = {"rawSeconds": 300}
    experiment = tmp_path / "long-ceiling.yaml"
    experiment.write_text(yaml.safe_dump(document))
    mark = uuid.uuid4().hex  # other tests may run probes on this machine at the same time
    process = subprocess.Popen(
        [*servinglab_cmd, "run", str(experiment)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, PROBE_MARK: mark},
    )  # fmt: skip
    assert process.stdout is not None
    try:
        seen = ""
        while "Ceiling: model alone at batch" not in seen:
            line = process.stdout.readline()
            assert line, seen
            seen += line
        assert probes_alive(mark)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=30)
        stopped_in = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, seen + rest
    assert stopped_in < 10 and "interrupted by SIGTERM" in rest
    assert not probes_alive(mark)


def test_a_parent_killed_with_sigkill_takes_its_probe_with_it(tmp_path: Path) -> None:
    """No `finally` runs in a SIGKILLed parent: the probe's watchdog ends it when the parent's end of
    their pipe closes, so the model alone does not go on holding the CPU or GPU."""
    mark = uuid.uuid4().hex
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from servinglab.measure.raw import probe; probe.measure('tiny', 'fp32', 'cpu', [8], 300)",
        ],
        env={**os.environ, PROBE_MARK: mark},
    )
    try:

        def measuring() -> bool:  # the probe itself, not only its watchdog, is running
            return any("servinglab.lifeline" not in " ".join(proc.info["cmdline"]) for proc in probes_alive(mark))

        deadline = time.monotonic() + 120
        while not measuring() and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
        assert measuring(), "the probe did not start"
        time.sleep(2)  # torch imported, the model built: the probe is at work
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5  # the probe's grace period is zero: SIGKILL follows SIGTERM at once
        while (left := probes_alive(mark)) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert not left, [proc.cmdline() for proc in left]


def test_the_model_alone_runs_with_the_data_paths_model_options_and_caches_them_apart() -> None:
    cache = RawCache()
    eager = rawprobe.measure("tiny", "fp32", "cpu", [2], 1.0, cache=cache)
    laid_out = rawprobe.measure("tiny", "fp32", "cpu", [2], 1.0, cache=cache, model_options={"channelsLast": True})
    assert eager.measured[2].throughput_rps > 0 and laid_out.measured[2].throughput_rps > 0
    assert laid_out.from_cache == []  # channels-last is another model here: not the eager rows again
    assert rawprobe.measure("tiny", "fp32", "cpu", [2], 1.0, cache=cache).from_cache == [2]
    with pytest.raises(rawprobe.RawProbeError, match=r"dataPath\.compile: reduce-overhead needs CUDA"):
        rawprobe.measure("tiny", "fp32", "cpu", [2], 1.0, model_options={"compile": "reduce-overhead"})
