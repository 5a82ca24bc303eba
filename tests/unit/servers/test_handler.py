"""The image handler without a server: a fake TorchServe context around the real tiny archive."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from servinglab.api import PayloadFormat
from servinglab.loadgen.payloads import make_payloads
from servinglab_image_handler import ServinglabImageHandler
from servinglab_imaging import decode_image, plan_precision, to_batch, top_k
from support.handler import handler_for, rows


def test_batch_of_mixed_formats_returns_one_answer_per_request(tiny_archive: Path) -> None:
    handler, context = handler_for(tiny_archive, "fp32")
    jpeg, png, raw = (make_payloads(fmt, 32, 1, seed=3)[0] for fmt in PayloadFormat)
    answers = handler.handle(rows(jpeg, png, raw), context)
    assert len(answers) == 3
    for answer in answers:
        predictions = json.loads(answer)["predictions"]
        assert len(predictions) == 3
        probabilities = [p["probability"] for p in predictions]
        assert probabilities == sorted(probabilities, reverse=True)
        assert all(0 <= p["class"] < 10 for p in predictions)
    assert context.metrics.values["ServinglabBatchedRequests"] == [3]
    assert context.metrics.values["ServinglabBatches"] == [1]
    assert context.metrics.values["ServinglabInferenceMs"][0] > 0


def test_a_bad_request_fails_alone(tiny_archive: Path) -> None:
    handler, context = handler_for(tiny_archive, "fp32")
    good = make_payloads(PayloadFormat.PNG, 32, 1, seed=3)[0]
    answers = handler.handle(rows(good, b"not an image", good), context)
    assert "predictions" in json.loads(answers[0])
    assert "neither JPEG, PNG" in json.loads(answers[1])["error"]
    assert context.statuses[1][0] == 400
    assert answers[0] == answers[2]


def test_same_image_same_answer_regardless_of_batch_neighbours(tiny_archive: Path) -> None:
    handler, context = handler_for(tiny_archive, "fp32")
    images = make_payloads(PayloadFormat.PNG, 32, 4, seed=9)
    alone = json.loads(handler.handle(rows(images[0]), context)[0])
    batched = json.loads(handler.handle(rows(*images), context)[0])
    assert [p["class"] for p in alone["predictions"]] == [p["class"] for p in batched["predictions"]]


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_reduced_precision_agrees_with_fp32(tiny_archive: Path, precision: str) -> None:
    images = make_payloads(PayloadFormat.PNG, 32, 4, seed=11)
    reference, ref_context = handler_for(tiny_archive, "fp32")
    reduced, context = handler_for(tiny_archive, precision)
    expected_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}[precision]
    assert next(reduced.model.parameters()).dtype == expected_dtype  # type: ignore[union-attr]
    for ours, theirs in zip(
        reduced.handle(rows(*images), context), reference.handle(rows(*images), ref_context), strict=True
    ):
        top_ours, top_ref = json.loads(ours)["predictions"][0], json.loads(theirs)["predictions"][0]
        assert top_ours["class"] == top_ref["class"]
        assert top_ours["probability"] == pytest.approx(top_ref["probability"], abs=0.02)


def test_precision_plan_reports_emulation_on_cpu_without_fp16_units() -> None:
    plan = plan_precision("fp16", torch.device("cpu"))
    assert plan.dtype is torch.float16
    flags = Path("/proc/cpuinfo").read_text()
    assert plan.native == ("avx512_fp16" in flags or "amx_fp16" in flags)
    assert ("emulated" in plan.note) == (not plan.native)
    with pytest.raises(ValueError, match="not one of"):
        plan_precision("int8", torch.device("cpu"))


def test_fp32_turns_tf32_off_even_if_something_switched_it_on(tiny_archive: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    handler_for(tiny_archive, "fp32")
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.get_float32_matmul_precision() == "highest"


def test_decode_accepts_channel_first_raw_and_resizes_images() -> None:
    chw = np.zeros((3, 16, 16), dtype=np.uint8)
    buffer = io.BytesIO()
    np.save(buffer, chw)
    assert decode_image(buffer.getvalue(), 16).shape == (16, 16, 3)
    big = make_payloads(PayloadFormat.JPEG, 64, 1, seed=0)[0]
    assert decode_image(big, 16).shape == (16, 16, 3)


def test_to_batch_normalises_and_honours_channels_last() -> None:
    white = np.full((8, 8, 3), 255, dtype=np.uint8)
    batch = to_batch([white, white], torch.device("cpu"), torch.float32, channels_last=True)
    assert batch.shape == (2, 3, 8, 8)
    assert batch.is_contiguous(memory_format=torch.channels_last)
    assert batch[0, 0, 0, 0].item() == pytest.approx((1 - 0.485) / 0.229, rel=1e-5)


def test_top_k_is_clamped_to_the_class_count() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    result = top_k(logits, 5)
    assert [p["class"] for p in result[0]] == [2, 1, 0]


def test_model_config_in_archive_is_valid_yaml(tiny_archive: Path) -> None:
    assert isinstance(yaml.safe_load((tiny_archive / "model-config.yaml").read_text()), dict)


def test_warm_up_runs_the_sizes_in_order_within_its_time_budget() -> None:
    from servinglab_imaging import warm_up

    ran: list[int] = []
    now = [0.0]  # the warm-up's clock: 2 ms per sample, however busy this machine is

    def forward(size: int) -> None:
        ran.append(size)
        now[0] += 0.002 * size

    report = warm_up(forward, [16, 1, 2, 4, 8, 32, 64], budget_seconds=0.1, clock=lambda: now[0])
    # 1+2+4+8+16 samples take ~62 ms; 32 more (~64 ms) would overrun 100 ms: skipped, and 64 with it
    assert ran == [1, 2, 4, 8, 16] == report["batchSizes"]
    assert report["skipped"] == [32, 64] and report["seconds"] <= 0.1
    assert warm_up(forward, [1, 2], budget_seconds=0, clock=lambda: now[0])["skipped"] == [1, 2]


def test_a_compiled_models_sizes_are_warmed_whatever_the_budget() -> None:
    """On an H200 a ResNet-50 compiled with CUDA graphs took ~10 s a size: a 60 s budget warmed 1, 2, 4 and the
    load's batches of 64 compiled inside the measured window (8 s a batch, 3.4 rps)."""
    from servinglab_imaging import warm_up

    ran: list[int] = []
    now = [0.0]

    def forward(size: int) -> None:  # a compile: ten seconds whatever the size
        ran.append(size)
        now[0] += 10.0

    sizes = [1, 2, 4, 8, 16, 32, 64]
    report = warm_up(forward, sizes, budget_seconds=60, clock=lambda: now[0], required=sizes)
    assert ran == sizes == report["batchSizes"] and report["skipped"] == []
    assert report["required"] == sizes and report["seconds"] == 70.0
    ran.clear()  # with no warm-up asked for (0 s), the compiles still run; nothing else does
    report = warm_up(forward, [1, 2, 3], budget_seconds=0, clock=lambda: now[0], required=[1, 2])
    assert ran == [1, 2] and report["skipped"] == [3]
    ran.clear()  # CUDA graphs record on a size's second call: each required size runs twice, the others once
    report = warm_up(forward, [1, 2, 3], budget_seconds=600, clock=lambda: now[0], required=[1, 2], required_passes=2)
    assert ran == [1, 1, 2, 2, 3] and report["batchSizes"] == [1, 2, 3]


def test_the_handler_file_defines_exactly_one_class_as_torchserve_requires() -> None:
    """TorchServe refuses a handler module with more than one class (its workers die at load): the
    server-neutral types live in servinglab_imaging.py."""
    import inspect

    import servinglab_image_handler

    defined = [obj for _, obj in inspect.getmembers(servinglab_image_handler, inspect.isclass)
               if obj.__module__ == servinglab_image_handler.__name__]  # fmt: skip
    assert defined == [ServinglabImageHandler]
