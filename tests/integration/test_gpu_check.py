"""`make gpu-check`'s CPU dry run: every step of the one GPU check runs here, small, so the script a lent GPU
runs never rots (benchmarks/gpu_check.py; the GPU figures are in docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The check's `--budget` (seconds; a step not begun by then is skipped) is a lent GPU's wall-clock time. This
#: test asserts that every step runs, so it gives no budget a slow host could spend (the dry run takes about
#: 250 s on 2 cores, the default budget is 480). The subprocess's timeout still bounds the run.
NO_BUDGET = "100000"

pytestmark = [pytest.mark.usefixtures("no_leftover_servers"), pytest.mark.timeout(2400)]


def test_the_gpu_check_dry_run_measures_each_form_and_each_server_and_says_what_it_could_not_run(
    tmp_path: Path,
) -> None:
    out = tmp_path / "check"
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(out)}
    command = ["hack/gpu-check.sh", "--budget", NO_BUDGET]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2200, check=False)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads((out / "gpu-check.json").read_text())
    steps = {entry["name"]: entry for entry in report["steps"]}
    assert report["mode"] == "dry-run" and report["environment"]["cudaAvailable"] is False
    assert steps["gpu-tests"]["status"] == "ran" and report["gpu_tests"]["collectedOnly"] is True
    assert {row["precision"] for row in report["raw"]} == {"fp32", "bf16"}
    # the smallest batch is always measured; a larger one the raw budget cannot fit on a slow host is skipped, saying so
    assert all(row["throughputRps"] > 0 for row in report["raw"] if row["batchSize"] == 1)
    assert all(row.get("throughputRps", 0) > 0 or "budget" in row["skipped"] for row in report["raw"])

    forms = {row["form"]: row for row in report["forms"]}
    for form in ("eager", "torchscript", "compile", "onnxruntime"):  # what a CPU runs: built, gated, timed
        assert forms[form]["status"] == "measured", forms[form]
        assert forms[form]["gate"]["passed"] and forms[form]["gate"]["maxRelError"] <= 1e-3
        assert forms[form]["throughputRps"] > 0 and forms[form]["buildSeconds"] >= 0
    assert forms["onnxruntime"]["provider"] == "CPUExecutionProvider"
    for form in ("compile-cudagraphs", "tensorrt"):  # refused, saying why
        assert forms[form]["status"] == "refused" and "needs a GPU" in forms[form]["reason"]
    cached = {row["form"]: row for row in report["forms_cached"]}
    assert cached["torchscript"]["cached"] is True and cached["onnxruntime"]["cached"] is True
    assert forms["torchscript"]["cached"] is False and forms["onnxruntime"]["cached"] is False

    served = {(row["server"], row["model"]): row for row in report["served"] if row}
    for kind in ("torchserve", "litserve", "triton"):  # each server, the built-in model
        assert steps[f"served-{kind}-builtin"]["status"] == "ran", steps[f"served-{kind}-builtin"]
        row = served[(kind, "tiny")]
        assert row["status"] == "ran" and row["errors"] == 0 and row["throughputRps"] > 0
        assert row["servedOverRaw"] > 0 and row["verdict"], row
    assert served[("torchserve", "tiny-user")]["servedOverRaw"] > 0  # the user-style export, on TorchServe
    for kind in ("litserve", "triton"):  # the user's model: served, or refused with the server's reason
        step = steps[f"served-{kind}-user"]
        assert step["status"] == "ran" or (step["status"] == "skipped" and "refuses a user's model" in step["reason"])

    in_forms = {row["form"]: row for row in report["served_forms"] if row}
    for form in ("eager", "torchscript"):  # served in each form the CPU builds: what ran is what was asked
        row = in_forms[form]
        assert row["status"] == "ran" and row["errors"] == 0 and row["payload"] == "raw", row
        assert row["formRun"]["form"] == form and row["servedOverRaw"] > 0
    assert in_forms["torchscript"]["formRun"]["gate"]["passed"] is True
    # each served run's whole results kept beside the report, and pytest's output
    kept = {path.name for path in out.glob("check-*.json")}
    assert {"check-torchserve-builtin.json", "check-torchserve-form-eager.json"} <= kept, kept
    assert json.loads((out / "check-torchserve-form-eager.json").read_text())["results"][0]["throughputRps"] > 0
    assert "collected" in (out / "gpu-tests.log").read_text()

    table = (out / "gpu-check.md").read_text()
    for heading in ("The model alone, per precision", "The model alone, per form", "Again: the build cache",
                    "Served, one good configuration per server",
                    "Served in each form (raw uint8 bodies)"):  # fmt: skip
        assert f"## {heading}" in table
