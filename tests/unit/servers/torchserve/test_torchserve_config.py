"""TorchServe configuration rendered from the spec, with the known precedence traps handled."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from servinglab.api import Precision, ServerSpec
from servinglab.servers.base import ServerError
from servinglab.servers.torchserve import config as tsconfig
from servinglab.servers.torchserve import launcher
from servinglab.servers.torchserve.local import LocalTorchServe

SERVER = ServerSpec(batch_size=16, max_batch_delay_ms=25, workers=3, precision=Precision.BF16)


def properties() -> dict[str, str]:
    return tsconfig.config_properties(
        "resnet50", SERVER, "/store", "/etc/metrics.yaml", tsconfig.Addresses(), number_of_gpu=0
    )


def test_models_json_is_keyed_by_the_archive_version() -> None:
    """TorchServe matches `models=` by the exact version string; "1" would not match "1.0"."""
    per_model = json.loads(properties()["models"])["resnet50"][tsconfig.ARCHIVE_VERSION]
    assert per_model["batchSize"] == 16
    assert per_model["maxBatchDelay"] == 25
    assert per_model["minWorkers"] == per_model["maxWorkers"] == 3


def test_auth_metrics_and_model_api_are_explicit() -> None:
    props = properties()
    assert props["metrics_mode"] == "prometheus"
    assert props["disable_token_authorization"] == "true"
    assert props["enable_model_api"] == "false"
    # registrations by name from the model store only (tests/integration/test_torchserve_server.py)
    assert props["allowed_urls"] == "/.*"
    assert props["load_models"] == "resnet50"
    assert props["default_workers_per_model"] == "3"


def test_properties_render_one_key_per_line() -> None:
    text = tsconfig.render_properties(properties())
    lines = text.splitlines()
    assert len(lines) == len(properties())
    assert "metrics_mode=prometheus" in lines


def test_model_config_pins_batching_timeouts_and_precision() -> None:
    """model-config.yaml wins over models= at startup, and is the only place timeouts are honoured."""
    config = yaml.safe_load(tsconfig.render_model_config(SERVER))
    assert config["batchSize"] == 16
    assert config["maxBatchDelay"] == 25
    assert config["minWorkers"] == config["maxWorkers"] == 3
    assert config["responseTimeout"] == SERVER.response_timeout_seconds
    assert config["startupTimeout"] == SERVER.startup_timeout_seconds
    assert config["handler"]["precision"] == "bf16"


def test_metrics_config_declares_the_handler_counters_and_frontend_counters() -> None:
    config = yaml.safe_load(tsconfig.render_metrics_config())
    model_counters = {m["name"] for m in config["model_metrics"]["counter"]}
    assert {"ServinglabBatches", "ServinglabBatchedRequests", "ServinglabInferenceMs"} <= model_counters
    frontend = {m["name"] for m in config["ts_metrics"]["counter"]}
    assert {"ts_inference_requests_total", "ts_queue_latency_microseconds"} <= frontend


def test_the_handler_warms_up_only_the_batches_the_load_can_form() -> None:
    """A closed loop of at most 8 users never forms a batch above 8: warming 16..1024 is wasted start-up."""
    from servinglab.api import LoadSpec

    big = ServerSpec(batch_size=1024, warmup_seconds=30)
    closed = yaml.safe_load(tsconfig.render_model_config(big, LoadSpec(concurrency=[1, 8])))["handler"]
    assert closed["warmupBatchSizes"] == [1, 2, 4, 8] and closed["warmupSeconds"] == 30
    open_loop = LoadSpec(mode="open", rates=[100])
    sizes = tsconfig.model_config(ServerSpec(batch_size=12), open_loop)["handler"]["warmupBatchSizes"]
    assert sizes == [1, 2, 4, 8, 12]
    # no warm-up: the handler still has the sizes (a compiled model compiles them first), and a budget of 0
    cold = tsconfig.model_config(ServerSpec(batch_size=12, warmup_seconds=0))["handler"]
    assert (cold["warmupBatchSizes"], cold["warmupSeconds"]) == ([1, 2, 4, 8, 12], 0)


def run_launcher(tmp_path: Path, fake_torchserve: str, workers: int = 1) -> tuple[int, str, float]:
    """The server container's launcher under the system sh, with a stand-in `torchserve` on PATH that
    writes TorchServe's logs into $LOGS; what an earlier start logged is there already."""
    bin_dir, logs = tmp_path / "bin", tmp_path / "logs"
    bin_dir.mkdir()
    logs.mkdir()
    (bin_dir / "torchserve").write_text("#!/bin/sh\n" + fake_torchserve)
    (bin_dir / "torchserve").chmod(0o755)
    (logs / "model_log.log").write_text("Failed to load model m, exception from an earlier start\n")
    (logs / "ts_log.log").write_text(f"{LOADED.format(9000)}\n{LOADED.format(9001)}\n")
    termination = tmp_path / "termination-log"
    script = launcher.server_launcher("m", workers, str(logs), str(tmp_path / "ready"), str(termination))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "LOGS": str(logs)}
    started = time.monotonic()
    process = subprocess.run(["sh", "-c", script, "torchserve", "--foreground"], env=env, start_new_session=True,
                             timeout=60, capture_output=True, check=False)  # fmt: skip
    message = termination.read_text() if termination.exists() else ""
    return process.returncode, message, time.monotonic() - started


#: TorchServe 0.12's log line for a worker that has loaded its model (logged twice in ts_log.log).
LOADED = (
    "[DEBUG] W-{0}-m_1.0 org.pytorch.serve.wlm.WorkerThread - W-{0}-m_1.0 "
    "State change WORKER_STARTED -> WORKER_MODEL_LOADED"
)


def test_the_server_launcher_ends_the_container_when_the_model_cannot_load(tmp_path: Path) -> None:
    failing = (
        "for attempt in 1 2 3; do "
        'echo "W-9000 Failed to load model m, exception boom $attempt" >> "$LOGS/model_log.log"; sleep 0.3; '
        "done; sleep 300\n"
    )
    code, message, seconds = run_launcher(tmp_path, failing)
    assert code == launcher.LOAD_FAILED_EXIT_CODE and seconds < 30, "it does not wait out the retries"
    assert message.startswith("ModelLoadFailed: TorchServe's workers could not load m ("), message
    attempts = int(message.split("(", 1)[1].split(" ", 1)[0])
    assert 2 <= attempts <= 3, "the failure logged before this start is not counted"
    assert message.endswith((": boom 2", ": boom 3")), "the cause is the handler's last exception"
    assert not (tmp_path / "ready").exists()


def test_the_server_launcher_ends_the_container_when_the_handler_cannot_even_be_imported(tmp_path: Path) -> None:
    # the worker dies importing the handler: initialize() never runs, only the frontend logs the death
    died = launcher.WORKER_DIED.format(model="m")
    failing = (
        "for attempt in 1 2 3; do "
        'echo "W-9000-m_1.0-stdout MODEL_LOG - AttributeError: no decode_image $attempt" >> "$LOGS/model_log.log"; '
        f'echo "[WARN ] W-9000-m_1.0 BatchAggregator - {died}" >> "$LOGS/ts_log.log"; sleep 0.3; '
        "done; sleep 300\n"
    )
    code, message, seconds = run_launcher(tmp_path, failing)
    assert code == launcher.LOAD_FAILED_EXIT_CODE and seconds < 30, "it does not wait out the retries"
    assert message.startswith("ModelLoadFailed: TorchServe's workers could not load m ("), message
    assert message.endswith(("AttributeError: no decode_image 2", "AttributeError: no decode_image 3")), message


def test_the_server_is_ready_once_every_worker_has_loaded_the_model(tmp_path: Path) -> None:
    # readiness seen by the stand-in itself: it exits 0 only if the ready file appears after both loads
    loading = (
        f'sleep 1.2; [ -f "$READY" ] && exit 1; echo "{LOADED.format(9000)}" >> "$LOGS/ts_log.log"; '
        f'echo "{LOADED.format(9000)}" >> "$LOGS/ts_log.log"; sleep 1.2; [ -f "$READY" ] && exit 2; '
        f'echo "{LOADED.format(9001)}" >> "$LOGS/ts_log.log"; sleep 1.2; [ -f "$READY" ] || exit 3; exit 0\n'
    )
    code, message, _ = run_launcher(tmp_path, loading.replace("$READY", str(tmp_path / "ready")), workers=2)
    assert code == 0 and message == "", f"stand-in exit {code}: 1 ready too early, 2 one worker counted twice, 3 never"


def test_the_server_launcher_passes_on_torchserves_exit(tmp_path: Path) -> None:
    code, message, _ = run_launcher(tmp_path, 'test "$1" = --foreground && exit 7\n')
    assert code == 7 and message == "", "the args reach torchserve and its exit code is the container's"


def test_a_local_work_directory_other_users_can_write_to_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """TorchServe loads what its model store holds and resolves relative registrations against its working
    directory: a folder another local user can write to would let them plant a model (and its code)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    server = LocalTorchServe("tiny", tmp_path / "no-archive", ServerSpec(), shared)
    with pytest.raises(ServerError) as refused:
        server.prepare()
    assert f"the work directory {shared} is writable by other users (mode 777)" in str(refused.value)
    assert list(shared.iterdir()) == []
    private = tmp_path / "private"
    with pytest.raises(FileNotFoundError):  # past the check: the (missing) archive is copied next
        LocalTorchServe("tiny", tmp_path / "no-archive", ServerSpec(), private).prepare()
    assert (private.stat().st_mode & 0o777) == 0o700
