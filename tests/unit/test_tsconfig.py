"""TorchServe configuration rendered from the spec, with the known precedence traps handled."""

from __future__ import annotations

import json

import yaml

from servinglab import tsconfig
from servinglab.spec import Precision, ServerSpec

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
    from servinglab.spec import LoadSpec

    big = ServerSpec(batch_size=1024, warmup_seconds=30)
    closed = yaml.safe_load(tsconfig.render_model_config(big, LoadSpec(concurrency=[1, 8])))["handler"]
    assert closed["warmupBatchSizes"] == [1, 2, 4, 8] and closed["warmupSeconds"] == 30
    open_loop = LoadSpec(mode="open", rates=[100])
    sizes = tsconfig.model_config(ServerSpec(batch_size=12), open_loop)["handler"]["warmupBatchSizes"]
    assert sizes == [1, 2, 4, 8, 12]
    assert tsconfig.model_config(ServerSpec(batch_size=12, warmup_seconds=0))["handler"]["warmupBatchSizes"] == []
