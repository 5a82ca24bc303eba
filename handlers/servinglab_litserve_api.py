"""LitServe entry point: servinglab's models on LitServe, through the very model code TorchServe runs.

Shipped in the model folder next to `servinglab_image_handler.py` and `servinglab_imaging.py` (the script
that starts the server puts the folder on sys.path). Each LitServe worker builds one
:class:`ServinglabImageHandler` and calls its server-neutral halves: `load()` in `setup()` (the model,
its precision and its warm-up, so LitServe's /health says ready only once every worker has all of
that), `run()` per batch (the same decoding, batching and answers as under TorchServe). What a worker
cannot load ends the server with "ModelLoadFailed: ..." in the failure log (a pod's termination
message).

Counters for the server-side breakdown go to Prometheus in multiprocess mode (each worker and each API
process writes its own file; the metrics port serves their sum):

* per batch, in the workers: batches, batched requests, milliseconds of preprocess / inference /
  postprocess, and each request's wait from its arrival to its batch's start (queue);
* per request, in LitServe's API processes: requests by status class and their time in the server;
* the settings each worker runs with (max batch size, batch timeout) and its readiness, so what the
  server applied is read from the server before any load is sent.

No `from __future__ import annotations` here: LitServe and FastAPI read `decode_request`'s annotation
at run time to learn how a request reaches the worker (the raw body and its arrival, through
:func:`receive`).
"""

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

# Every process of the server (API processes forked, workers spawned) writes its counters under this
# folder, which must be known before prometheus_client is first imported.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
os.environ.setdefault(MULTIPROC_ENV, tempfile.mkdtemp(prefix="servinglab-litserve-metrics-"))

import litserve as ls  # noqa: E402
from fastapi import Depends, Request, Response  # noqa: E402

#: Where the model folder says what to load (written when servinglab lays the folder out for LitServe).
SERVE_FILE = "servinglab-serve.json"
#: The prefix of every metric this API emits.
PREFIX = "servinglab_litserve"
#: The reason a server ends with when a worker cannot load the model.
MODEL_LOAD_FAILED = "ModelLoadFailed"
#: The exit code of a server that gave up on its model (the same as TorchServe's launcher).
LOAD_FAILED_EXIT_CODE = 3

_metrics: dict[str, Any] = {}


def _metric(kind: str, name: str, help_text: str, **options: Any) -> Any:
    """A counter or gauge of this process, made on first use (never in the main process, which only
    serves the sum, so its folder can be cleared before the workers start)."""
    if name not in _metrics:
        import prometheus_client

        made = getattr(prometheus_client, kind)(f"{PREFIX}_{name}", help_text, **options)
        _metrics[name] = made
    return _metrics[name]


async def receive(request: Request) -> tuple[float, bytes]:
    """A request as it travels to a worker: when it arrived (monotonic, the same clock in every process
    of this machine) and its raw body, whatever its content type."""
    body = await request.body()
    return time.monotonic(), body


class ServinglabAPI(ls.LitAPI):
    """One model served by LitServe: `max_batch_size` and `batch_timeout` are LitServe's own batching
    knobs; `handler` the settings servinglab's handler takes (precision, warm-up, top-k)."""

    def __init__(
        self,
        model_dir: str,
        model_name: str,
        handler: dict[str, Any],
        max_batch_size: int = 1,
        batch_timeout: float = 0.0,
        failure_log: str | None = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path="/predict")
        self.model_dir = model_dir
        self.model_name = model_name
        self.handler_settings = handler
        self.failure_log = failure_log
        self.model: Any = None

    def setup(self, device: str) -> None:
        folder = Path(self.model_dir)
        gpu_id = int(device.split(":", 1)[1]) if device.startswith("cuda:") else None
        try:
            from servinglab_image_handler import ServinglabImageHandler

            files = json.loads((folder / SERVE_FILE).read_text())
            model = ServinglabImageHandler()
            model.load(folder, files["serializedFile"], files.get("modelFile"), self.handler_settings, gpu_id,
                       self.max_batch_size)  # fmt: skip
        except Exception as exc:
            self._gave_up(device, exc)
            raise
        self.model = model
        # what the log says of how the worker runs (the local server reads these lines back)
        print(f"servinglab precision: {model.plan.note}", flush=True)
        print(f"servinglab warm-up: {json.dumps(model.warmup_report)}", flush=True)
        if model.batches is not None:
            path = model.batches.plan.report(model.input["kind"])
            print(f"servinglab data path: {json.dumps(path)}", flush=True)
        _metric("Gauge", "max_batch_size", "The largest batch this worker forms.", multiprocess_mode="max").set(
            self.max_batch_size
        )
        _metric("Gauge", "batch_timeout_ms", "How long this worker waits to fill a batch.",
                multiprocess_mode="max").set(self.batch_timeout * 1000.0)  # fmt: skip
        _metric("Gauge", "worker_ready", "Workers that have loaded the model.", multiprocess_mode="livesum").set(1)

    def _gave_up(self, device: str, exc: Exception) -> None:
        """Say why in the failure log (the first worker to fail says it), for whoever waits on the server."""
        message = f"{MODEL_LOAD_FAILED}: LitServe's worker on {device} could not load {self.model_name}: " + (
            f"{type(exc).__name__}: {exc}"
        )
        print(message, file=sys.stderr, flush=True)
        log = Path(self.failure_log) if self.failure_log else None
        # a pod's /dev/termination-log is there from the start, empty: a worker that failed first wrote it
        if log is not None and log.parent.is_dir() and not (log.is_file() and log.stat().st_size):
            log.write_text(message[:4000])

    def decode_request(self, request: Annotated[tuple[float, bytes], Depends(receive)]) -> tuple[float, bytes]:
        return request

    def batch(self, inputs: list[tuple[float, bytes]]) -> list[tuple[float, bytes]]:
        return list(inputs)

    def predict(self, x: Any) -> Any:
        """One batch (a list when LitServe batches, a single request when max_batch_size is 1)."""
        requests = x if isinstance(x, list) else [x]
        begun = time.monotonic()
        ran = self.model.run([{"body": body} for _, body in requests])
        answers = [(400 if index in ran.rejected else 200, text) for index, text in enumerate(ran.responses)]
        started, preprocessed, inferred, finished = ran.timings
        _metric("Counter", "batches", "Batches run.").inc()
        _metric("Counter", "batched_requests", "Requests run in batches.").inc(len(requests))
        _metric("Counter", "queue_ms", "Milliseconds requests waited from arrival to their batch.").inc(
            sum(max(begun - arrived, 0.0) for arrived, _ in requests) * 1e3
        )
        _metric("Counter", "preprocess_ms", "Milliseconds of preprocess per batch.").inc((preprocessed - started) * 1e3)
        _metric("Counter", "inference_ms", "Milliseconds of inference per batch.").inc((inferred - preprocessed) * 1e3)
        _metric("Counter", "postprocess_ms", "Milliseconds of postprocess per batch.").inc((finished - inferred) * 1e3)
        return answers if isinstance(x, list) else answers[0]

    def unbatch(self, output: list[tuple[int, str]]) -> list[tuple[int, str]]:
        return output

    def encode_response(self, output: tuple[int, str]) -> Response:
        # a Response per request: a rejected image is answered 400 alone, not its whole batch
        status, text = output
        return Response(content=text, status_code=status, media_type="application/json")


class RequestMetrics:
    """ASGI middleware of LitServe's API processes: each request to `path`, by status class, and its
    time in the server (from its arrival to the end of its answer)."""

    def __init__(self, app: Any, path: str = "/predict") -> None:
        self.app = app
        self.path = path

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") != self.path:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                _metric("Counter", "requests", "Requests answered.", labelnames=["code"]).labels(
                    f"{status[0] // 100}xx"
                ).inc()
                _metric("Counter", "request_ms", "Milliseconds requests spent in the server.").inc(
                    (time.perf_counter() - started) * 1e3
                )

        await self.app(scope, receive, sending)


def _address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


class _Settled:
    """The processes' counter files summed, read again when one was caught being created (a new worker's
    file has no valid header for a moment, and the read would fail the whole scrape with HTTP 500)."""

    def __init__(self, collector: Any) -> None:
        self.collector = collector

    def collect(self) -> Any:
        for attempt in range(5):
            try:
                return list(self.collector.collect())
            except Exception:
                if attempt == 4:
                    raise
                time.sleep(0.05)
        return []


def serve(server: ls.LitServer, listen: str, metrics_listen: str, failure_log: str | None) -> None:
    """Run `server` on `listen` (HOST:PORT) with its counters on `metrics_listen`; a worker that cannot load
    the model ends this process with exit code 3 and the reason in `failure_log`."""
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    folder = Path(os.environ[MULTIPROC_ENV])
    shutil.rmtree(folder, ignore_errors=True)  # the counters of a previous start in this folder
    folder.mkdir(parents=True, exist_ok=True)
    registry = CollectorRegistry()
    registry.register(_Settled(multiprocess.MultiProcessCollector(None, path=str(folder))))
    metrics_host, metrics_port = _address(metrics_listen)
    start_http_server(metrics_port, metrics_host, registry=registry)
    host, port = _address(listen)
    # As a container's PID 1 nothing ends this process on SIGTERM unless it says how: LitServe stops its
    # API processes and workers on KeyboardInterrupt. Its API processes are forked from this one and
    # inherit the handler: they end as SIGTERM ends them.
    main = os.getpid()

    def interrupt(signum: int, frame: Any) -> None:
        if os.getpid() != main:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        server.run(host=host, port=port, generate_client_file=False, log_level="warning")
    finally:
        said = Path(failure_log).read_text() if failure_log and Path(failure_log).is_file() else ""
        if said.startswith(f"{MODEL_LOAD_FAILED}: "):
            sys.exit(LOAD_FAILED_EXIT_CODE)
