"""LitServe's knobs from a validated spec, and the script that starts LitServe with them (pure).

servinglab's axes map onto LitServe 0.2's own knobs:

* batchSize -> `LitAPI(max_batch_size=...)`;
* maxBatchDelayMs -> `LitAPI(batch_timeout=...)`, in seconds. LitServe's worker waits that long for the
  batch to fill from the moment it starts collecting, where TorchServe waits from the first request;
* workers -> `LitServer(workers_per_device=...)` on each of the devices (the CPU, or the GPUs: as many of
  them as the workers divide among, since LitServe runs the same number on each). LitServe also starts
  one API process per worker (its default `num_api_servers`), so its front end grows with the workers;
* precision (and the handler's other settings) -> servinglab's LitAPI, which runs the same handler code
  as TorchServe (:mod:`servinglab.servers.handler`);
* responseTimeoutSeconds -> `LitServer(timeout=...)`.

The script is the one file that starts LitServe: the local server runs it, a pod runs it from the
experiment's ConfigMap, and a sweep exports the winner's as its deployable configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

from servinglab.api import ExperimentSpec, ServerSpec
from servinglab.servers.handler import handler_settings

#: The LitServe this renders for (pyproject.toml pins the same; a unit test keeps them equal).
LITSERVE_VERSION = "0.2.19"
#: The path LitServe serves predictions on (the LitAPI's `api_path`).
API_PATH = "/predict"
#: The script's file name (in the experiment's ConfigMap, a local server's work folder, an export).
SCRIPT = "server.py"
#: servinglab's LitAPI, shipped in the model folder with the handler files.
API_FILE = "servinglab_litserve_api.py"
#: Written into the model folder: what the LitAPI loads (the serialized model, and a built-in's code).
SERVE_FILE = "servinglab-serve.json"
#: The reason a server ends with when a worker cannot load the model (the LitAPI says the same).
MODEL_LOAD_FAILED = "ModelLoadFailed"
#: Where every process of the server keeps its counters (the LitAPI's multiprocess Prometheus folder).
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(frozen=True)
class Knobs:
    """LitServe's settings for one configuration."""

    max_batch_size: int
    batch_timeout_seconds: float
    workers_per_device: int
    accelerator: str
    devices: int
    timeout_seconds: int


def knobs(server: ServerSpec, gpus: int) -> Knobs:
    """The knobs with `gpus` GPUs at hand (0: the CPU): LitServe runs the same number of workers on each
    device, so it uses as many of them as the workers divide among (:func:`devices_for`)."""
    devices = max(devices_for(server.workers, gpus), 1)
    return Knobs(
        max_batch_size=server.batch_size,
        batch_timeout_seconds=server.max_batch_delay_ms / 1000.0,
        workers_per_device=server.workers // devices,
        accelerator="cuda" if gpus > 0 else "cpu",
        devices=devices,
        timeout_seconds=server.response_timeout_seconds,
    )


def devices_for(workers: int, gpus: int) -> int:
    """How many of `gpus` GPUs LitServe uses: the most that the workers divide among (3 workers on 2 GPUs
    run on one; TorchServe would spread them 2 + 1)."""
    return max((d for d in range(1, gpus + 1) if workers % d == 0), default=0)


_TEMPLATE = '''\
"""LitServe serving {model}: batchSize {batch}, maxBatchDelayMs {delay}, {workers} worker(s), {precision}.

    python {script} --model-dir DIR [--listen HOST:PORT] [--metrics-listen HOST:PORT]

DIR is the model folder servinglab lays out for LitServe (`servinglab build-model {model} --into DIR
--server litserve`): the model, servinglab's handler files and {api_file}.
Needs litserve=={version}, torch and prometheus-client. Predictions: POST the image as the body to
{api_path}; /health answers 200 once every worker has loaded the model.
"""

import argparse
import sys

parser = argparse.ArgumentParser(description="LitServe serving {model}")
parser.add_argument("--model-dir", default={model_dir!r}, help="the model folder")
parser.add_argument("--listen", default="0.0.0.0:8000", help="HOST:PORT of the inference API")
parser.add_argument("--metrics-listen", default="0.0.0.0:8002", help="HOST:PORT of the Prometheus metrics")
parser.add_argument("--failure-log", default="/dev/termination-log", help="why a model could not be loaded")
args = parser.parse_args()
sys.path.insert(0, args.model_dir)  # servinglab's LitAPI and handler files

import litserve as ls  # noqa: E402
from servinglab_litserve_api import RequestMetrics, ServinglabAPI, serve  # noqa: E402

if __name__ == "__main__":
    api = ServinglabAPI(
        model_dir=args.model_dir,
        model_name={model!r},
        handler={handler!r},
        max_batch_size={max_batch_size!r},  # batchSize
        batch_timeout={batch_timeout!r},  # maxBatchDelayMs, in seconds
        failure_log=args.failure_log,
    )
    server = ls.LitServer(
        api,
        accelerator={accelerator!r},
        devices={devices!r},
        workers_per_device={workers_per_device!r},  # workers, on each device
        timeout={timeout!r},  # responseTimeoutSeconds
        middlewares=[(RequestMetrics, {{"path": api.api_path}})],
    )
    serve(server, args.listen, args.metrics_listen, args.failure_log)
'''


def render_script(spec: ExperimentSpec, gpus: int, model_dir: str) -> str:
    """The script that starts LitServe for this configuration on `gpus` GPUs, serving `model_dir` unless
    told another folder (`--model-dir`)."""
    server = spec.server
    found = knobs(server, gpus)
    return _TEMPLATE.format(
        model=spec.model.name,
        batch=server.batch_size,
        delay=server.max_batch_delay_ms,
        workers=server.workers,
        precision=server.precision,
        script=SCRIPT,
        api_file=API_FILE,
        api_path=API_PATH,
        version=LITSERVE_VERSION,
        model_dir=model_dir,
        handler=handler_settings(server, spec.load),
        max_batch_size=found.max_batch_size,
        batch_timeout=found.batch_timeout_seconds,
        accelerator=found.accelerator,
        devices=found.devices,
        workers_per_device=found.workers_per_device,
        timeout=found.timeout_seconds,
    )
