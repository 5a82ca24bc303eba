"""Pure renderers of TorchServe 0.12 configuration from a validated spec.

Three files, all derived from `ExperimentSpec.server`:

* `config.properties` — addresses, metrics mode, auth, queue size, and the `models=` JSON;
* `model-config.yaml` — placed inside the model's (no-archive) directory; TorchServe gives it
  precedence over `models=` for batchSize / maxBatchDelay, and it is the only place where response
  and startup timeouts are honoured once an archive has a config file (see the facts file, §1.6);
  its `handler:` section tells our handler the precision and the data path;
* `metrics.yaml` — TorchServe's default frontend metrics plus the handler's counters, so they are
  exported to Prometheus.

The traps handled here: `models=` is keyed by the archive's exact version string ("1.0"); values
<= 0 are ignored by TorchServe (the spec forbids them); token auth and model API are set explicitly
rather than left to version-dependent defaults; config snapshots are disabled by the launcher
(`--ncs`) so a stale snapshot can never override what is rendered here.

Used by the local TorchServe (:mod:`.local`) and its pod (:mod:`.pod`); the launcher that watches a
server container is in :mod:`.launcher`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

from servinglab.api import LoadSpec, ServerSpec
from servinglab.servers.handler import handler_settings

ARCHIVE_VERSION = "1.0"

#: TorchServe's `allowed_urls` (comma-separated regexes, each matched against a whole registration URL).
#: How TorchServe 0.12 treats the `url` of a model or workflow registration (ModelArchive.downloadModel):
#: one that matches a pattern is fetched with java.net.URL into the store; one that matches none is
#: refused if it is a file:// or http(s):// URL, and otherwise read as a path: a name in the store, or
#: a directory anywhere on disk, unchecked. So a list of "our" URLs alone would still load any absolute
#: directory path, and the default list fetches any file:// or http(s):// URL — with a workflow archive
#: even while `enable_model_api` is false. The one pattern here sends every absolute path to the fetch,
#: which cannot fetch a path (no scheme) and refuses it; every URL with a scheme matches nothing and is
#: refused. What is left is a bare name in the model store, which sits in a directory only this user can
#: write (the local runner's private work directory; a pod's emptyDir): `load_models=<name>` at start-up
#: and the local sweep's re-registration (`url=<name>`) load that, and nothing else can be registered.
ALLOWED_URLS = "/.*"


@dataclass(frozen=True)
class Addresses:
    """Where TorchServe listens. In a pod inference/metrics bind 0.0.0.0; management stays local."""

    inference: str = "http://127.0.0.1:8080"
    management: str = "http://127.0.0.1:8081"
    metrics: str = "http://127.0.0.1:8082"
    grpc_inference_port: int = 7070
    grpc_management_port: int = 7071


def _frontend_settings(server: ServerSpec) -> dict[str, int]:
    """Per-model frontend keys, the same in model-config.yaml and in config.properties' `models=`."""
    return {
        "minWorkers": server.workers,
        "maxWorkers": server.workers,
        "batchSize": server.batch_size,
        "maxBatchDelay": server.max_batch_delay_ms,
        "responseTimeout": server.response_timeout_seconds,
        "startupTimeout": server.startup_timeout_seconds,
    }


def model_config(server: ServerSpec, load: LoadSpec | None = None) -> dict[str, Any]:
    """The model-config.yaml contents: frontend batching/worker keys and the handler's settings."""
    return {
        **_frontend_settings(server),
        "jobQueueSize": server.job_queue_size,
        "handler": handler_settings(server, load),
    }


def render_model_config(server: ServerSpec, load: LoadSpec | None = None) -> str:
    return yaml.safe_dump(model_config(server, load), sort_keys=False)


def config_properties(
    model_name: str,
    server: ServerSpec,
    model_store: str,
    metrics_config: str,
    addresses: Addresses,
    number_of_gpu: int,
    model_api: bool = False,
) -> dict[str, str]:
    """config.properties as an ordered mapping (rendered with :func:`render_properties`). `model_api`
    allows registering models through the management API (a local sweep reconfigures its server that
    way; the management address stays on loopback)."""
    per_model = _frontend_settings(server)
    return {
        "inference_address": addresses.inference,
        "management_address": addresses.management,
        "metrics_address": addresses.metrics,
        "grpc_inference_address": "127.0.0.1",
        "grpc_management_address": "127.0.0.1",
        "grpc_inference_port": str(addresses.grpc_inference_port),
        "grpc_management_port": str(addresses.grpc_management_port),
        "model_store": model_store,
        "load_models": model_name,
        "models": json.dumps({model_name: {ARCHIVE_VERSION: per_model}}, separators=(",", ":")),
        "default_workers_per_model": str(server.workers),
        "job_queue_size": str(server.job_queue_size),
        "number_of_gpu": str(number_of_gpu),
        "default_response_timeout": str(server.response_timeout_seconds),
        "default_startup_timeout": str(server.startup_timeout_seconds),
        # Token auth stays off: in 0.12 it guards inference too (every load request would carry a key that
        # expires after 60 minutes). What keeps a local user who can reach the management port (every user
        # of the machine, on loopback) from running code through it is `allowed_urls` (see ALLOWED_URLS).
        "disable_token_authorization": "true",
        "enable_model_api": "true" if model_api else "false",
        "allowed_urls": ALLOWED_URLS,
        "install_py_dep_per_model": "false",
        "metrics_mode": "prometheus",
        "metrics_config": metrics_config,
        "async_logging": "true",
    }


def render_properties(properties: dict[str, str]) -> str:
    """Java .properties text; values here never contain characters that need escaping."""
    return "".join(f"{key}={value}\n" for key, value in properties.items())


# TorchServe's default frontend metric set (ts/configs/metrics.yaml @ v0.12.0), kept verbatim in
# meaning, plus the counters our handler emits. A custom metrics_config replaces the default file.
_FRONTEND_DIMS = ["Level", "Hostname"]
_MODEL_DIMS = ["model_name", "model_version", "hostname"]


def metrics_config() -> dict[str, Any]:
    def metric(name: str, unit: str, dims: list[str]) -> dict[str, Any]:
        return {"name": name, "unit": unit, "dimensions": dims}

    handler_counters = [
        ("ServinglabBatches", "count"),
        ("ServinglabBatchedRequests", "count"),
        ("ServinglabPreprocessMs", "ms"),
        ("ServinglabInferenceMs", "ms"),
        ("ServinglabPostprocessMs", "ms"),
    ]
    return {
        "dimensions": ["ModelName", "Level", "Hostname"],
        "ts_metrics": {
            "counter": [
                metric("Requests2XX", "Count", _FRONTEND_DIMS),
                metric("Requests4XX", "Count", _FRONTEND_DIMS),
                metric("Requests5XX", "Count", _FRONTEND_DIMS),
                metric("ts_inference_requests_total", "Count", _MODEL_DIMS),
                metric("ts_inference_latency_microseconds", "Microseconds", _MODEL_DIMS),
                metric("ts_queue_latency_microseconds", "Microseconds", _MODEL_DIMS),
            ],
            "gauge": [
                metric("QueueTime", "Milliseconds", _FRONTEND_DIMS),
                metric("WorkerThreadTime", "Milliseconds", _FRONTEND_DIMS),
                metric("WorkerLoadTime", "Milliseconds", ["WorkerName", *_FRONTEND_DIMS]),
                metric("CPUUtilization", "Percent", ["Level", "Hostname"]),
                metric("MemoryUsed", "Megabytes", ["Level", "Hostname"]),
                metric("MemoryAvailable", "Megabytes", ["Level", "Hostname"]),
                metric("MemoryUtilization", "Percent", ["Level", "Hostname"]),
                metric("DiskUsage", "Gigabytes", ["Level", "Hostname"]),
                metric("DiskUtilization", "Percent", ["Level", "Hostname"]),
                metric("DiskAvailable", "Gigabytes", ["Level", "Hostname"]),
                metric("GPUMemoryUtilization", "Percent", ["Level", "DeviceId", "Hostname"]),
                metric("GPUMemoryUsed", "Megabytes", ["Level", "DeviceId", "Hostname"]),
                metric("GPUUtilization", "Percent", ["Level", "DeviceId", "Hostname"]),
            ],
        },
        "model_metrics": {
            "counter": [metric(name, unit, ["ModelName", "Level"]) for name, unit in handler_counters],
            "gauge": [
                metric("HandlerTime", "ms", ["ModelName", "Level"]),
                metric("PredictionTime", "ms", ["ModelName", "Level"]),
                metric("ServinglabLastBatchSize", "count", ["ModelName", "Level"]),
            ],
        },
    }


def render_metrics_config() -> str:
    return yaml.safe_dump(metrics_config(), sort_keys=False)
