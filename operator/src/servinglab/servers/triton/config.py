"""Pure renderers of a Triton model's `config.pbtxt` from a validated spec, the reading of the
configuration Triton says it applied, and its comparison with what was written (:func:`differences`).

The spec's knobs map onto Triton's model configuration:

* batch size -> `max_batch_size`, with `dynamic_batching { max_queue_delay_microseconds }` from the max
  batch delay (a batch size of 1 is "no batching": the batcher never waits for a batch that is full);
* workers -> `instance_group [{ count, kind }]`: KIND_CPU, or KIND_GPU with the copies spread over the GPUs
  the server may use (one group per GPU: Triton's count is per GPU), so that workers is the total either way;
* precision, warm-up and the top-k the answer lists -> `parameters`, which servinglab's Python model
  (`handlers/servinglab_triton_model.py`) reads when an instance starts.

The input is one BYTES element per request (the encoded image, as the load generator sends it in the
KServe v2 protocol); the outputs are a built-in's top-k classes and their probabilities, or a user's
model's answer (the handler's JSON, one BYTES element). Used by the local Triton
(:mod:`.local`), its pod (:mod:`.pod`) and the export of a winning configuration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from servinglab.api import LoadSpec, ServerSpec
from servinglab.api.results import EffectiveSettings
from servinglab.servers.handler import warmup_batch_sizes

#: The model's input tensor (one BYTES element: an encoded image) and its outputs: a built-in's top-k classes
#: and probabilities; a user's model's answer, the handler's JSON (as TorchServe and LitServe answer).
INPUT_NAME = "INPUT"
OUTPUT_CLASSES = "CLASSES"
OUTPUT_PROBABILITIES = "PROBABILITIES"
OUTPUT_ANSWER = "ANSWER"
TOP_K = 5
#: The one version servinglab serves of a model (Triton's repository layout: <model>/<version>/).
VERSION = "1"


def _quote(text: str) -> str:
    return json.dumps(text)  # a protobuf text-format string is a JSON string for what is written here


def render_config(
    model_name: str, server: ServerSpec, gpus: int, load: LoadSpec | None = None, user_model: bool = False
) -> str:
    """config.pbtxt of `model_name` served by servinglab's Python model; `gpus` is how many GPUs the server
    may use (0: the instances run on the CPU); a `user_model` answers with the handler's JSON."""
    parameters = _parameters(server, load)
    groups = instance_groups(server.workers, gpus)
    outputs = (
        [f'  {{ name: "{OUTPUT_ANSWER}", data_type: TYPE_STRING, dims: [1] }}']
        if user_model
        else [
            f'  {{ name: "{OUTPUT_CLASSES}", data_type: TYPE_INT64, dims: [{TOP_K}] }},',
            f'  {{ name: "{OUTPUT_PROBABILITIES}", data_type: TYPE_FP32, dims: [{TOP_K}] }}',
        ]
    )
    lines = [
        f"name: {_quote(model_name)}",
        'backend: "python"',
        f"max_batch_size: {server.batch_size}",
        f'input [{{ name: "{INPUT_NAME}", data_type: TYPE_STRING, dims: [1] }}]',
        "output [",
        *outputs,
        "]",
        f"dynamic_batching {{ max_queue_delay_microseconds: {server.max_batch_delay_ms * 1000} }}",
        f"instance_group [{', '.join(groups)}]",
        *(f"parameters {{ key: {_quote(k)}, value: {{ string_value: {_quote(v)} }} }}" for k, v in parameters.items()),
    ]
    return "\n".join(lines) + "\n"


def _parameters(server: ServerSpec, load: LoadSpec | None) -> dict[str, str]:
    """What servinglab's Python model reads when an instance starts."""
    return {
        "precision": str(server.precision),
        # also with no warm-up (0 s): a compiled model still compiles these sizes first (warm_up's `required`)
        "warmup_batch_sizes": ",".join(map(str, warmup_batch_sizes(server.batch_size, load))),
        "warmup_seconds": f"{server.warmup_seconds:g}",
        "top_k": str(TOP_K),
        **({"form": str(server.form)} if server.form is not None else {}),
        **({"compile": str(server.compile_mode())} if str(server.compile_mode()) != "none" else {}),
    }


def instance_groups(workers: int, gpus: int) -> list[str]:
    """`workers` model copies in all: on the CPU, or spread over the GPUs one by one (Triton's `count` is per
    GPU listed, so each GPU gets a group of its own share)."""
    if gpus == 0:
        return [f"{{ count: {workers}, kind: KIND_CPU }}"]
    shares = [workers // gpus + (1 if gpu < workers % gpus else 0) for gpu in range(gpus)]
    return [f"{{ count: {share}, kind: KIND_GPU, gpus: [{gpu}] }}" for gpu, share in enumerate(shares) if share]


@dataclass(frozen=True)
class AppliedConfig:
    """What Triton's model configuration endpoint says it applied (GET /v2/models/<model>/config)."""

    max_batch_size: int
    max_queue_delay_us: int | None
    instances: int
    kinds: tuple[str, ...]
    parameters: dict[str, str]
    #: The backend that serves the model (`python`: servinglab's model; a native one: :mod:`.native`).
    backend: str | None = None

    def effective(self, ready_instances: int) -> EffectiveSettings:
        """The settings in effect: the batch Triton forms, its delay (in whole ms, as the spec has it), the
        instance count it configured and how many of them are loaded."""
        delay = None if self.max_queue_delay_us is None else self.max_queue_delay_us // 1000
        return EffectiveSettings(
            batch_size=max(1, self.max_batch_size), max_batch_delay_ms=delay, min_workers=self.instances,
            max_workers=self.instances, ready_workers=ready_instances, backend=self.backend,
        )  # fmt: skip


def read_applied(config: dict[str, Any]) -> AppliedConfig:
    """The parts of Triton's JSON model configuration servinglab checks (protobuf JSON: 64-bit integers may
    come as strings)."""
    batching = config.get("dynamic_batching")
    delay = int(batching.get("max_queue_delay_microseconds", 0)) if isinstance(batching, dict) else None
    groups = config.get("instance_group") or []
    parameters = {
        str(key): str(value.get("string_value", "")) for key, value in (config.get("parameters") or {}).items()
    }
    return AppliedConfig(
        max_batch_size=int(config.get("max_batch_size", 0)),
        max_queue_delay_us=delay,
        instances=sum(int(group.get("count", 1)) for group in groups),
        kinds=tuple(str(group.get("kind", "")) for group in groups),
        parameters=parameters,
        backend=str(config["backend"]) if config.get("backend") else None,
    )


def expected(server: ServerSpec, gpus: int, load: LoadSpec | None = None) -> AppliedConfig:
    """What Triton reports when it serves the config.pbtxt :func:`render_config` writes."""
    groups = instance_groups(server.workers, gpus)
    return AppliedConfig(
        max_batch_size=server.batch_size,
        max_queue_delay_us=server.max_batch_delay_ms * 1000,
        instances=server.workers,
        kinds=("KIND_GPU",) * len(groups) if gpus else ("KIND_CPU",),
        parameters=_parameters(server, load),
        backend="python",
    )


def differences(model_name: str, wanted: AppliedConfig, applied: AppliedConfig) -> str | None:
    """Why the configuration Triton serves is not the one servinglab wrote (each differing field, in effect
    and asked for), or None. The instances' kind is not compared: a GPU-less stand-in node (the test
    cluster's) runs the GPU instances on the CPU."""
    fields = [
        ("max_batch_size", applied.max_batch_size, wanted.max_batch_size),
        ("dynamic_batching.max_queue_delay_microseconds", applied.max_queue_delay_us, wanted.max_queue_delay_us),
        ("instance_group count", applied.instances, wanted.instances),
        ("backend", applied.backend, wanted.backend),
        *((f"parameters.{key}", applied.parameters.get(key), value) for key, value in wanted.parameters.items()),
    ]
    differing = [f"{name} is {have!r}, the spec's is {want!r}" for name, have, want in fields if have != want]
    if not differing:
        return None
    return f"Triton serves {model_name} with another configuration than the spec's: {'; '.join(differing)}"
