"""A real TorchServe configured from the spec: the requested settings are the ones in effect,
batches really form under concurrent load, and the handler answers through the server."""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from servinglab.api import PayloadFormat, Precision, ServerSpec
from servinglab.loadgen.payloads import CONTENT_TYPES, make_payloads
from servinglab.servers.torchserve import metrics as tsmetrics
from servinglab.servers.torchserve.local import LocalTorchServe
from support.serving import ready_server

pytestmark = pytest.mark.torchserve


def serve(archive: Path, workdir: Path, **settings: object) -> LocalTorchServe:
    return LocalTorchServe("tiny", archive, ServerSpec.model_validate(settings), workdir)


def test_requested_batching_and_workers_are_in_effect_and_batches_form(
    tiny_archive: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    serving = ready_server(partial(serve, tiny_archive, tmp_path, batchSize=4, maxBatchDelayMs=300, workers=2), 120)
    with serving as (server, cold_start):
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
    with ready_server(lambda: serve(tiny_archive, tmp_path, batchSize=2, maxBatchDelayMs=5), 120) as (server, _):
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
        with ready_server(partial(serve, tiny_archive, workdir, precision=str(precision)), 120) as (server, _):
            code, answers[precision] = server.predict(body, "image/jpeg")
            assert code == 200
        log = (workdir / "logs" / "model_log.log").read_text()
        assert f"servinglab precision: {precision}" in log
    assert answers[Precision.FP32]["predictions"][0]["class"] == answers[Precision.BF16]["predictions"][0]["class"]


def plant(archive: Path, into: Path, marker: Path) -> Path:
    """A copy of the tiny model whose handler, once a worker imports it, writes `marker`: code anyone
    who can register a model would get run as the user who runs the server."""
    shutil.copytree(archive, into)
    handler = into / "servinglab_image_handler.py"
    handler.write_text(handler.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    return into


def zipped(folder: Path, archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w") as packed:
        for path in folder.rglob("*"):
            packed.write(path, path.relative_to(folder))
    return archive


def workflow_archive(path: Path, marker: Path) -> Path:
    """A workflow archive whose one function node's handler writes `marker` when a worker imports it."""
    workflow = {"workflowName": "flow", "specFile": "spec.yaml", "handler": "flow_handler.py"}
    manifest = {"createdOn": "01/01/2026 00:00:00", "archiverVersion": "0.2.15", "workflow": workflow}
    with zipfile.ZipFile(path, "w") as packed:
        packed.writestr("WAR-INF/MANIFEST.json", json.dumps(manifest))
        packed.writestr("spec.yaml", "models:\n  min-workers: 1\n  max-workers: 1\ndag:\n  pre: []\n")
        handler = f"open({str(marker)!r}, 'w').close()\n\ndef pre(data, context):\n    return data\n"
        packed.writestr("flow_handler.py", handler)
    return path


def register(server: LocalTorchServe, kind: str, url: str, name: str) -> tuple[int, str]:
    """Register a model or workflow under `name` (a name of its own: a refusal is never a name clash)."""
    named = {"models": "model_name", "workflows": "workflow_name"}[kind]
    query = urllib.parse.urlencode({"url": url, named: name, "initial_workers": 1, "synchronous": "true"})
    request = urllib.request.Request(f"{server.addresses.management}/{kind}?{query}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def listed(server: LocalTorchServe, kind: str) -> list[str]:
    """The registered models or workflows, by name."""
    with urllib.request.urlopen(f"{server.addresses.management}/{kind}", timeout=10) as response:
        entries = json.loads(response.read())[kind]
    return sorted(entry["modelName" if kind == "models" else "workflowName"] for entry in entries)


def test_nothing_from_outside_the_model_store_can_be_registered_while_the_store_still_can(
    tiny_archive: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    """Every local user reaches the management port on loopback, and a local sweep's server has the model
    API on (it re-registers its model to reconfigure it). A model or workflow from any URL or path outside
    the model store is refused, so no one runs code in the server that way; by name from the store (what
    the sweep's reconfigure does) still registers."""
    outside = tmp_path / "outside"
    outside.mkdir()
    ran = {kind: outside / f"{kind}-handler-ran" for kind in ("model", "workflow")}
    folder = plant(tiny_archive, outside / "planted", ran["model"])
    mar = zipped(folder, outside / "planted.mar")
    war = workflow_archive(outside / "flow.war", ran["workflow"])
    files = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(outside)))
    threading.Thread(target=files.serve_forever, daemon=True).start()
    web = f"http://127.0.0.1:{files.server_address[1]}"
    # TorchServe's default allowed_urls fetch every file:// and http(s):// URL, and any absolute path
    # to a directory is loaded without consulting them
    foreign = [
        ("models", f"file://{mar}"), ("models", f"{web}/planted.mar"), ("models", str(folder)),
        ("models", str(mar)), ("models", f"FILE://{mar}"), ("models", "planted/../planted"),
        ("workflows", f"file://{war}"), ("workflows", f"{web}/flow.war"), ("workflows", str(war)),
    ]  # fmt: skip
    serving = ready_server(
        partial(LocalTorchServe, "tiny", tiny_archive, ServerSpec(), tmp_path / "ts", model_api=True), 120
    )
    try:
        with serving as (server, _):
            answers = {url: register(server, kind, url, f"foreign{n}") for n, (kind, url) in enumerate(foreign)}
            refused = {url: status for url, (status, _) in answers.items() if 400 <= status < 500}
            assert refused.keys() == {url for _, url in foreign}, answers
            assert listed(server, "models") == ["tiny"] and listed(server, "workflows") == []
            assert not any(marker.exists() for marker in ran.values())

            # The same model and workflow, put into the model store, register by name and run their
            # handlers: what was refused above would have run.
            store = tmp_path / "ts" / "model-store"
            shutil.copytree(folder, store / "planted")
            shutil.copy(war, store / "flow.war")
            assert register(server, "models", "planted", "planted")[0] == 200
            assert register(server, "workflows", "flow.war", "flow")[0] == 200
            assert listed(server, "models") == ["planted", "tiny"]
            assert listed(server, "workflows") == ["flow"]
            assert all(marker.exists() for marker in ran.values())
            # the local sweep's reconfigure: unregister the served model, register it again by name
            assert server.reconfigure(ServerSpec(batch_size=2, max_batch_delay_ms=7), None) > 0
            assert (server.status().batch_size, server.status().max_batch_delay_ms) == (2, 7)
    finally:
        files.shutdown()
