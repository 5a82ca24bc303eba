"""The handler's data path through a real TorchServe: each CPU option reaches the workers (their own
report, read back as the results' `runtime.dataPath`) and the answers stay those of the default path;
a CUDA option on this machine is refused before any server starts, naming the setting."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from servinglab.api import PayloadFormat, ServerSpec
from servinglab.api.exitcodes import ExitCode
from servinglab.loadgen.payloads import make_payloads
from servinglab.servers.torchserve.local import LocalTorchServe
from support.manifests import experiment
from support.serving import ready_server

pytestmark = pytest.mark.torchserve

#: Each option, and what the workers must report for it.
OPTIONS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"decodeThreads": 4}, {"decode_threads": 4}),
    ({"transfer": "float"}, {"transfer": "float"}),
    ({"channelsLast": True}, {"channels_last": True}),
    ({"compile": "default"}, {"compile": "default", "padded_batch_sizes": [1, 2]}),
]


def spec(data_path: dict[str, Any]) -> ServerSpec:
    return ServerSpec.model_validate({"batchSize": 2, "maxBatchDelayMs": 5, "warmupSeconds": 60, "gpus": 0,
                                      "dataPath": data_path})  # fmt: skip


def test_every_cpu_option_reaches_the_workers_and_keeps_the_answers(
    tiny_archive: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    bodies = make_payloads(PayloadFormat.JPEG, 48, 3, seed=13)  # resized to 32x32 by the handler
    serving = ready_server(lambda: LocalTorchServe("tiny", tiny_archive, spec({}), tmp_path, model_api=True), 120)
    with serving as (server, _):
        notes = server.notes().data_path
        assert notes is not None and (notes.decode, notes.decode_threads, notes.compile) == ("cpu", 1, "none")
        expected = [server.predict(body, "image/jpeg")[1]["predictions"] for body in bodies]
        for setting, report in OPTIONS:
            server.reconfigure(spec(setting))
            ran = server.notes().data_path
            assert ran is not None and {key: getattr(ran, key) for key in report} == report, ran
            for body, predictions in zip(bodies, expected, strict=True):
                code, answer = server.predict(body, "image/jpeg")
                assert code == 200, (setting, answer)
                assert answer["predictions"][0]["class"] == predictions[0]["class"], setting
                assert answer["predictions"][0]["probability"] == pytest.approx(predictions[0]["probability"],
                                                                                abs=1e-4)  # fmt: skip


def test_a_cuda_path_is_refused_before_any_server_starts(tmp_path: Path, servinglab_cmd: list[str]) -> None:
    document = experiment("dev", server={"gpus": 1, "dataPath": {"decode": "device"}},
                          load={"concurrency": [1], "durationSeconds": 1, "warmupSeconds": 0})  # fmt: skip
    (tmp_path / "dev.yaml").write_text(yaml.safe_dump(document))
    command = [*servinglab_cmd, "run", str(tmp_path / "dev.yaml")]
    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=no_gpu, timeout=120)
    assert done.returncode == ExitCode.FAILED, done.stderr
    assert "server.dataPath.decode: device (torchvision's decode_jpeg runs on CUDA) needs a GPU, and none is " \
           "visible" in done.stdout + done.stderr  # fmt: skip
    assert "Preparing model" not in done.stdout + done.stderr
