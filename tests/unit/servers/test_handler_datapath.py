"""The handler's data path without a server: every CPU option changes what runs (the worker's report says
so) and keeps the answers; the CUDA options are refused on this machine with the setting named."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from servinglab.api import PayloadFormat
from servinglab.loadgen.payloads import make_payloads
from servinglab_datapath import BatchMaker, DataPathError, plan_data_path, sizes_to_compile
from servinglab_image_handler import ServinglabImageHandler as Handler
from support.handler import FakeContext, rows

CPU = torch.device("cpu")


def handler_with(model_dir: Path, data_path: dict[str, Any], caplog: pytest.LogCaptureFixture) -> Handler:
    context = FakeContext(model_dir, "fp32")
    context.model_yaml_config["handler"].update(dataPath=data_path, warmupSeconds=30)
    handler = Handler()
    with caplog.at_level(logging.INFO):
        handler.initialize(context)
    return handler


def reported(caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("servinglab data path:")]
    assert lines, "the worker did not report its data path"
    found: dict[str, Any] = json.loads(lines[-1].split(":", 1)[1])
    return found


def _first_weight(handler: Handler) -> torch.Tensor:
    return next(handler.model.parameters())  # type: ignore[no-any-return]


REALISED = {
    "decodeThreads": lambda h: h.batches.pool is not None and h.batches.pool._max_workers == 3,
    "transfer": lambda h: h.batches.plan.transfer == "float",
    "channelsLast": lambda h: _first_weight(h).is_contiguous(memory_format=torch.channels_last),
    "compile": lambda h: type(h.model).__name__ == "OptimizedModule",
}


@pytest.mark.parametrize(
    ("setting", "report"),
    [
        ({"decodeThreads": 3}, {"decodeThreads": 3}),
        ({"transfer": "float"}, {"transfer": "float"}),
        ({"channelsLast": True}, {"channelsLast": True}),
        ({"compile": "default"}, {"compile": "default", "paddedBatchSizes": [1, 2, 4]}),
    ],
)
def test_each_cpu_option_runs_reports_itself_and_keeps_the_answers(
    tiny_archive: Path, caplog: pytest.LogCaptureFixture, setting: dict[str, Any], report: dict[str, Any]
) -> None:
    images = [*make_payloads(PayloadFormat.JPEG, 32, 3, seed=21), b"not an image"]
    baseline = handler_with(tiny_archive, {}, caplog)
    assert reported(caplog)["note"].startswith("PIL decode on 1 thread(s)")
    caplog.clear()
    handler = handler_with(tiny_archive, setting, caplog)
    ran = reported(caplog)
    assert {key: ran[key] for key in report} == report
    (option,) = setting
    assert REALISED[option](handler) and not REALISED[option](baseline)
    context = FakeContext(tiny_archive, "fp32")
    ours = handler.handle(rows(*images), context)
    theirs = baseline.handle(rows(*images), FakeContext(tiny_archive, "fp32"))
    assert json.loads(ours[3])["error"].startswith("payload is neither JPEG") and context.statuses[3][0] == 400
    for mine, reference in zip(ours[:3], theirs[:3], strict=True):  # 3 rows: a compiled model pads them to 4
        top, expected = json.loads(mine)["predictions"][0], json.loads(reference)["predictions"][0]
        assert top["class"] == expected["class"]
        assert top["probability"] == pytest.approx(expected["probability"], abs=1e-4)


def test_the_decode_pool_makes_the_same_batch_as_one_thread() -> None:
    bodies = make_payloads(PayloadFormat.JPEG, 48, 6, seed=4) + make_payloads(PayloadFormat.PNG, 32, 2, seed=4)
    made = [
        BatchMaker(plan_data_path({"decodeThreads": threads}, CPU, "image", 8), CPU, torch.float32, {"size": 32})
        .make([*bodies[:3], b"\x00junk", *bodies[3:]])
        for threads in (1, 4)
    ]  # fmt: skip
    one, pool = made
    assert one.batch is not None and pool.batch is not None
    assert torch.equal(one.batch, pool.batch)
    assert one.valid == pool.valid == [0, 1, 2, 4, 5, 6, 7, 8]
    assert list(pool.errors) == [3]


def test_float_transfer_normalises_on_the_cpu_to_the_same_pixels() -> None:
    bodies = make_payloads(PayloadFormat.PNG, 32, 4, seed=8)
    batches = [
        BatchMaker(plan_data_path({"transfer": transfer}, CPU, "image", 4), CPU, torch.float32, {"size": 32})
        .make(bodies).batch
        for transfer in ("uint8", "float")
    ]  # fmt: skip
    assert batches[0] is not None and batches[1] is not None
    assert torch.allclose(batches[0], batches[1], atol=1e-5)


@pytest.mark.parametrize(
    ("setting", "named"),
    [({"decode": "device"}, "dataPath.decode: device needs CUDA"),
     ({"pinnedCopies": True}, "dataPath.pinnedCopies: True needs CUDA"),
     ({"compile": "reduce-overhead"}, "dataPath.compile: reduce-overhead needs CUDA")],
)  # fmt: skip
def test_cuda_paths_are_refused_on_a_machine_without_one(setting: dict[str, Any], named: str) -> None:
    with pytest.raises(DataPathError, match=named):
        plan_data_path(setting, CPU, "image", 8)


def test_a_tensor_model_cannot_decode_on_the_device() -> None:
    with pytest.raises(DataPathError, match="decode: device decodes JPEG images; this model takes tensors"):
        plan_data_path({"decode": "device"}, torch.device("cuda"), "tensor", 8)  # planning touches no GPU
    plan = plan_data_path({"decodeThreads": 2}, CPU, "tensor", 8)
    assert plan.report("tensor")["note"].startswith("tensor bodies parsed on 2 CPU thread(s)")
    assert plan.channels_last is False and plan.transfer == "as declared"


def test_compiling_without_a_compiler_is_refused_naming_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(DataPathError, match=r"dataPath.compile: default needs a C\+\+ compiler .* there is none"):
        plan_data_path({"compile": "default"}, CPU, "image", 8)


@pytest.mark.parametrize(("largest", "compiled"), [(8, [1, 2, 4, 8]), (6, [1, 2, 4, 8]), (3, [1, 2, 4]), (1, [1])])
def test_the_sizes_compiled_before_serving_include_the_one_the_largest_batch_is_padded_to(
    largest: int, compiled: list[int]
) -> None:
    """6 users form batches of 6, padded to 8: size 8's graph must be compiled before serving too."""
    plan = plan_data_path({"compile": "default"}, torch.device("cpu"), "image", 8)
    assert plan.padded_sizes == (1, 2, 4, 8)
    assert sizes_to_compile(plan, largest) == compiled
    assert sizes_to_compile(plan_data_path({}, torch.device("cpu"), "image", 8), largest) == []  # eager


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("rows", [5, 7, 8])
def test_every_batch_runs_the_graph_its_warm_up_compiled(channels_last: bool, rows: int) -> None:
    """A compiled graph is guarded on its input's strides: a batch of 5 or 7 padded to 8, or one of 8 in
    another layout, must reach the graph that the warm-up's zeros of 8 compiled, not compile another (on a GPU,
    where channels-last is the default, torch.cat's padding of two rows or more came out contiguous and compiled
    each padded size anew inside the measured window: 0 rps on an H200)."""
    from torch._dynamo.testing import CompileCounter

    from servinglab_datapath import run_model, warm_up_passes

    plan = plan_data_path({"compile": "default", "channelsLast": channels_last}, CPU, "image", 8)
    assert warm_up_passes(plan) == 1
    torch._dynamo.reset()  # graphs compiled for Conv2d.forward by other tests are not counted here
    counter = CompileCounter()
    model = torch.nn.Conv2d(3, 4, 3).eval()
    compiled = torch.compile(model, backend=counter, dynamic=False)  # as compile_model does, counting graphs
    warm_layout = torch.channels_last if channels_last else torch.contiguous_format
    run_model(compiled, torch.zeros(8, 3, 8, 8).contiguous(memory_format=warm_layout), plan)  # the warm-up's pass
    assert counter.frame_count == 1
    for layout in (torch.channels_last, torch.contiguous_format):
        batch = torch.rand(rows, 3, 8, 8).contiguous(memory_format=layout)
        with torch._dynamo.config.patch(error_on_recompile=True):
            output = run_model(compiled, batch, plan)
        assert counter.frame_count == 1 and output.shape[0] == rows
        torch.testing.assert_close(output, model(batch), rtol=1e-5, atol=1e-5)


def test_a_channels_last_compiled_worker_serves_a_padded_batch_without_compiling(
    tiny_archive: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker as TorchServe runs it (on a GPU channels-last is the default; here it is asked for): its warm-up
    compiles each padded size, and a batch of 5, padded with 3 copies to 8, runs the graph compiled for 8."""
    context = FakeContext(tiny_archive, "fp32", batch_size=8)
    context.model_yaml_config["handler"].update(dataPath={"compile": "default", "channelsLast": True}, warmupSeconds=0)
    handler = Handler()
    with caplog.at_level(logging.INFO):
        handler.initialize(context)
    assert reported(caplog)["paddedBatchSizes"] == [1, 2, 4, 8]
    images = make_payloads(PayloadFormat.JPEG, 32, 5, seed=5)
    with torch._dynamo.config.patch(error_on_recompile=True):
        answers = handler.handle(rows(*images), context)
    assert [sorted(json.loads(answer)) for answer in answers] == [["predictions"]] * 5
