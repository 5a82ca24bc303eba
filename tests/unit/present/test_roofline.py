"""The roofline: bytes counted where FLOPs are, the intensity at the batch, the roofs of known devices, and the
report's figure and sentence (with what is not known said, on this CPU)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from test_report import SERVINGLAB, closed_loop_document

from servinglab.api.ceiling import Ceiling
from servinglab.measure.ceiling import MEMORY_GBS, PEAK_TFLOPS, bytes_per_inference, roofline
from servinglab.models.counting import builtin_counts, bytes_moved


def test_bytes_are_counted_from_the_forward_pass() -> None:
    linear = torch.nn.Linear(4, 3)  # weights 4x3 + bias 3 floats; one output row of 3 floats, written and read
    assert bytes_moved(linear, torch.zeros(1, 4)) == ((12 + 3) * 4, 2 * 3 * 4)
    stack = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.ReLU(), torch.nn.Flatten())
    # the convolution's and the ReLU's outputs (8x5x5 floats each); flattening is a view and moves nothing
    assert bytes_moved(stack, torch.zeros(1, 3, 5, 5)) == (8 * 3 * 9 * 4, 2 * 2 * 8 * 25 * 4)
    counts = builtin_counts("tiny")
    assert counts["weightBytes"] > 4 * counts["parameters"]  # BatchNorm's running statistics are read too
    assert counts["activationBytes"] > 0


def test_the_weights_are_shared_by_the_batch_and_the_precision_halves_the_bytes() -> None:
    assert bytes_per_inference(1000, 50, 1, "fp32") == 1050
    assert bytes_per_inference(1000, 50, 10, "fp32") == 150
    assert bytes_per_inference(1000, 50, 10, "fp16") == bytes_per_inference(1000, 50, 10, "bf16") == 75


def ceiling(accelerator: str | None) -> Ceiling:
    return Ceiling(flops_per_inference=8_000_000_000, served_rps=1000.0, formed_batch_size_mean=64.0,
                   raw_batch_size=64, raw_at_formed_batch_rps=12000.0, raw_best_rps=13000.0, raw_best_batch_size=256,
                   accelerator=accelerator)  # fmt: skip


def test_on_a_known_gpu_the_points_sit_under_both_roofs() -> None:
    assert set(MEMORY_GBS) == set(PEAK_TFLOPS)  # every device with a compute roof has a memory roof
    found = roofline(ceiling("H100"), 100_000_000, 300_000_000, "fp16", "cuda")
    assert found.peak_flops == 989.4e12 and found.bandwidth == 3350e9 and found.unknown == []
    assert found.ridge == pytest.approx(989.4e12 / 3350e9)
    served, raw, best = found.points
    assert served.intensity == pytest.approx(8e9 / ((100e6 / 64 + 300e6) / 2))
    assert served.flops_per_second == 1000.0 * 8e9 and served.batch_size == 64
    assert best.intensity > raw.intensity == served.intensity  # a larger batch shares the weights more
    assert found.bound(served.intensity) == "memory"
    assert found.attainable(served.intensity) == pytest.approx(3350e9 * served.intensity)


def test_on_the_cpu_the_points_are_drawn_and_the_missing_roofs_are_said() -> None:
    found = roofline(ceiling(None), 100_000_000, 300_000_000, "fp32", "cpu")
    assert len(found.points) == 3 and found.peak_flops is None and found.attainable(10.0) is None
    assert found.unknown == ["no compute or memory roof for cpu (servinglab knows these for NVIDIA GPUs only)"]
    uncounted = roofline(ceiling("T4"), None, None, "bf16", "cuda")
    assert uncounted.points == [] and uncounted.bandwidth == 320e9
    assert uncounted.unknown[0] == "T4 has no bf16 compute roof" and "were not counted" in uncounted.unknown[1]


def test_the_report_draws_the_roofline_and_reads_it(tmp_path: Path) -> None:
    document = closed_loop_document()
    document["modelInfo"] = {"name": "tiny", "weightBytes": 40_000, "activationBytes": 500_000}
    document["ceiling"]["servedRps"] = 250.0
    document["runtime"] = {"mode": "local", "device": "cpu", "dataPath": {"note": "PIL decode on 4 thread(s)"}}
    (tmp_path / "results.json").write_text(json.dumps(document))
    done = subprocess.run([SERVINGLAB, "report", str(tmp_path / "results.json")], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    figure = tmp_path / "results" / "roofline.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 10_000
    page = (tmp_path / "results" / "index.html").read_text()
    assert 'src="roofline.png"' in page
    intensity = 3244672 / (40_000 / 4 + 500_000)  # at the raw batch 4 (no formed mean here), fp32
    assert f"Roofline: {intensity:.1f} FLOPs per byte at the served batch 4 (fp32); no compute or memory roof" in page
    assert "Data path, as the workers ran it: PIL decode on 4 thread(s)" in page
