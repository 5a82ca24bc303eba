"""The data path's CUDA options on a real GPU: device decode, pinned overlapped copies, CUDA graphs.

Not collected by `pytest` (CI has no GPU: `norecursedirs` leaves tests/gpu out); run on a GPU machine:

    hack/device-bundle.sh                                     # here: the wheels, pytest among them
    source hack/device-setup.sh && python3 -m pytest -q -p no:cacheprovider tests/gpu   # there

Each option runs on the GPU and makes the batch (or the answers) the default path makes, within what the
option may change (nvJPEG's and libjpeg's inverse DCTs differ by a level or two of 255).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from servinglab.api import PayloadFormat
from servinglab.loadgen.payloads import make_payloads
from servinglab_datapath import BatchMaker, plan_data_path
from servinglab_image_handler import ServinglabImageHandler
from support.handler import FakeContext, rows


@pytest.fixture(scope="module")
def gpu() -> torch.device:
    assert torch.cuda.is_available(), "tests/gpu needs a GPU (CUDA) on this machine"
    return torch.device("cuda:0")


def maker(settings: dict[str, Any], device: torch.device, size: int = 32) -> BatchMaker:
    return BatchMaker(plan_data_path(settings, device, "image", 8), device, torch.float32, {"size": size})


def test_device_decode_makes_the_batch_the_cpu_makes(gpu: torch.device) -> None:
    bodies = make_payloads(PayloadFormat.JPEG, 64, 6, seed=31) + make_payloads(PayloadFormat.PNG, 64, 1, seed=31)
    reference = maker({}, gpu, 48).make([*bodies, b"\xff\xd8\xff broken"])
    decoded = maker({"decode": "device"}, gpu, 48).make([*bodies, b"\xff\xd8\xff broken"])
    assert decoded.batch is not None and reference.batch is not None and decoded.batch.device.type == "cuda"
    assert decoded.valid == reference.valid == list(range(7)) and list(decoded.errors) == [7]
    # resized 64 -> 48 on the GPU (antialiased bilinear) and by PIL: the same picture, not the same bits
    assert (decoded.batch - reference.batch).abs().mean().item() < 0.05


def test_pinned_overlapped_copies_make_exactly_the_default_batch(gpu: torch.device) -> None:
    bodies = make_payloads(PayloadFormat.JPEG, 32, 8, seed=32)
    for transfer in ("uint8", "float"):
        plain = maker({"transfer": transfer}, gpu).make(bodies).batch
        pinned = maker({"transfer": transfer, "pinnedCopies": True, "decodeThreads": 4}, gpu)
        for _ in range(3):  # the staging buffer is reused from batch to batch
            made = pinned.make(bodies).batch
            assert made is not None and plain is not None and torch.equal(made.cpu(), plain.cpu())
    assert pinned.staging is not None and pinned.staging.is_pinned()


@pytest.mark.parametrize("data_path", [{"compile": "reduce-overhead"}, {"decode": "device", "compile": "default"}])
def test_compiled_and_device_paths_answer_as_the_default_path(
    tiny_archive: Path, gpu: torch.device, caplog: pytest.LogCaptureFixture, data_path: dict[str, Any]
) -> None:
    images = make_payloads(PayloadFormat.JPEG, 32, 5, seed=33)  # 5 rows: padded with 3 copies to the size 8

    def handler(settings: dict[str, Any]) -> tuple[ServinglabImageHandler, FakeContext]:
        context = FakeContext(tiny_archive, "fp32", batch_size=8)
        context.system_properties["gpu_id"] = 0
        context.model_yaml_config["handler"].update(dataPath=settings, warmupSeconds=300)
        served = ServinglabImageHandler()
        with caplog.at_level(logging.INFO):
            served.initialize(context)
        return served, context

    reference, ref_context = handler({})
    caplog.clear()
    served, context = handler(data_path)
    reports = [r.getMessage() for r in caplog.records if r.getMessage().startswith("servinglab data path:")]
    ran = json.loads(reports[-1].split(":", 1)[1])
    assert ran["device"] == "cuda:0" and all(ran[key] == value for key, value in data_path.items())
    with torch._dynamo.config.patch(error_on_recompile=True):  # the warm-up compiled the graph the batch runs
        answers = served.handle(rows(*images), context)
    for ours, theirs in zip(answers, reference.handle(rows(*images), ref_context), strict=True):
        top, expected = json.loads(ours)["predictions"][0], json.loads(theirs)["predictions"][0]
        assert top["probability"] == pytest.approx(expected["probability"], abs=0.05)
