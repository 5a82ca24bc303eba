"""A real TorchServe configured from the spec: the requested settings are the ones in effect,
batches really form under concurrent load, and the handler answers through the server."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from servinglab.api import PayloadFormat, Precision, ServerSpec
from servinglab.loadgen.payloads import CONTENT_TYPES, make_payloads
from servinglab.servers.torchserve import metrics as tsmetrics
from servinglab.servers.torchserve.local import LocalTorchServe

pytestmark = pytest.mark.torchserve


def serve(archive: Path, workdir: Path, **settings: object) -> LocalTorchServe:
    return LocalTorchServe("tiny", archive, ServerSpec.model_validate(settings), workdir)


def test_requested_batching_and_workers_are_in_effect_and_batches_form(
    tiny_archive: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    server = serve(tiny_archive, tmp_path, batchSize=4, maxBatchDelayMs=300, workers=2)
    with server:
        cold_start = server.wait_ready(120)
        assert cold_start > 0
        status = server.status()
        assert (status.batch_size, status.max_batch_delay_ms) == (4, 300)
        assert (status.min_workers, status.max_workers, status.ready_workers) == (2, 2, 2)

        body = make_payloads(PayloadFormat.PNG, 32, 1, seed=0)[0]
        before = tsmetrics.parse(server.metrics_text(), "tiny")
        # 16 simultaneous requests, 2 workers, batch 4, 300 ms delay: batches must fill up.
        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(lambda _: server.predict(body, "image/png"), range(16)))
        after = tsmetrics.parse(server.metrics_text(), "tiny")
    assert all(code == 200 for code, _ in answers)
    breakdown = tsmetrics.breakdown(before, after)
    assert breakdown.server_requests == 16
    assert breakdown.mean_batch_size is not None and breakdown.mean_batch_size > 1.5


def test_handler_through_the_server_accepts_every_format_and_rejects_garbage(
    tiny_archive: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    with serve(tiny_archive, tmp_path, batchSize=2, maxBatchDelayMs=5) as server:
        server.wait_ready(120)
        for fmt in PayloadFormat:
            code, answer = server.predict(make_payloads(fmt, 32, 1, seed=2)[0], CONTENT_TYPES[fmt])
            assert code == 200, answer
            assert len(answer["predictions"]) == 5
        code, answer = server.predict(b"\x00" * 100, "application/octet-stream")
        assert code == 400
        assert "neither JPEG, PNG" in answer["error"]


def test_precision_reaches_the_worker_and_keeps_predictions(
    tiny_archive: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    body = make_payloads(PayloadFormat.JPEG, 32, 1, seed=5)[0]
    answers = {}
    for precision in (Precision.FP32, Precision.BF16):
        workdir = tmp_path / str(precision)
        with serve(tiny_archive, workdir, precision=str(precision)) as server:
            server.wait_ready(120)
            code, answers[precision] = server.predict(body, "image/jpeg")
            assert code == 200
        log = (workdir / "logs" / "model_log.log").read_text()
        assert f"servinglab precision: {precision}" in log
    assert answers[Precision.FP32]["predictions"][0]["class"] == answers[Precision.BF16]["predictions"][0]["class"]
