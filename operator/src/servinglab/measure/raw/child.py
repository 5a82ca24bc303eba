"""The model alone, in a child process: raw throughput at several batch sizes within a time budget.

    python -m servinglab.measure.raw.child '{"model": "tiny", "precision": "fp32", "device": "cpu",
                                      "batchSizes": [8, 1, 2, 4], "seconds": 5, "dataPath": {"compile": "default"}}'

Started by :mod:`servinglab.measure.raw.probe` (never imported by the load-generating process: it imports
torch). It runs in its own process so that Ctrl-C/SIGTERM end it at once even inside a forward pass
that does not return to Python for a minute, and so that its memory is given back when it exits.

It prints one JSON object per line on stdout, in order:
``{"event": "ready", "device"}``, then per batch size ``{"event": "start",
"batchSize"}`` followed by ``{"event": "measured", ...}`` or ``{"event": "skipped", "batchSize",
"reason"}``, and finally ``{"event": "done", "measureSeconds"}``.

The budget (`seconds`) bounds the measuring, not the setup (process start, model load): the first
batch size always gets at least one pass (a pass longer than the whole budget is reported as one
pass); later sizes are skipped when their estimated pass would not fit in what is left, or when
their estimated activations would not fit in free memory.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from servinglab.api.ceiling import DeclaredInput, RawRow
from servinglab.measure.raw.protocol import RawRequest

#: Free memory a batch may plan to use; the rest stays for the system and the allocator's slack.
MEMORY_FRACTION = 0.8
#: Peak activation memory of a forward pass, as a multiple of the largest single activation:
#: a layer's input and output coexist, and residual networks keep one more tensor alive.
ACTIVATION_FACTOR = 3
#: Uncounted passes at most before timing: cuDNN picks its algorithms on the first pass, TorchScript's
#: profiling executor optimises the graph on its second and third (a traced ResNet-50 on an H200: 0.70 s,
#: 1.04 s, then 4.5 ms a pass).
WARM_PASSES = 4
#: Two passes in a row within this factor of each other: the model runs as it will from now on.
STEADY_FACTOR = 1.25
#: Contiguous groups of passes compared; the best one is the figure (a shared machine's background
#: work only ever slows a group down, and a ceiling is what the model reaches undisturbed).
SEGMENTS = 5


_EVENTS: IO[str] = sys.stdout


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), file=_EVENTS, flush=True)


def keep_stdout_for_events() -> None:
    """Events own stdout; anything else printed here or by children (an archive build) goes to stderr."""
    global _EVENTS  # noqa: PLW0603 (one process, one stream)
    _EVENTS = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)


def largest_activation_bytes(network: Any, sample: Any) -> int:
    """Bytes of the largest tensor any leaf module produces for one sample (one forward at batch 1)."""
    import torch

    largest = 0

    def record(_module: Any, _inputs: Any, output: Any) -> None:
        nonlocal largest
        if isinstance(output, torch.Tensor):
            largest = max(largest, output.numel() * output.element_size())

    leaves = [m for m in network.modules() if not list(m.children())]
    handles = [m.register_forward_hook(record) for m in leaves]
    try:
        with torch.inference_mode():
            network(sample)
    finally:
        for handle in handles:
            handle.remove()
    return int(max(largest, sample.numel() * sample.element_size()))


def free_memory_bytes(device: Any) -> int:
    import psutil
    import torch

    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return int(psutil.virtual_memory().available)


def best_segment_rps(batch_size: int, pass_seconds: list[float]) -> float:
    """Inferences per second of the best of up to SEGMENTS contiguous groups of passes."""
    count = min(SEGMENTS, len(pass_seconds))
    size = len(pass_seconds) // count
    groups = [pass_seconds[i * size : (i + 1) * size] for i in range(count)]
    return max(batch_size * len(group) / sum(group) for group in groups)


class Probe:
    """The model on its device, converted to the precision and compiled or laid out channels-last exactly as
    the handler does it (its own helpers); in the form it was served in: the file servinglab built and gated
    beside the model (`formFile`: TorchScript, ONNX), loaded as the handler loads it."""

    def __init__(
        self, model: str, precision: str, device_name: str, data_path: Mapping[str, object], largest: int
    ) -> None:
        import torch

        from servinglab.models import counting

        self.torch = torch
        self.device = torch.device(device_name)
        imaging, datapath = counting.handler_imaging(), counting.handler_datapath()
        self.plan = imaging.plan_precision(precision, self.device)
        self.input = DeclaredInput(kind="image")
        if os.path.isdir(model):  # the user's model as servinglab packed it, with its declared input
            network, self.input = counting.packed_network(model)
            self.size = self.input.size or 224
        else:
            network, self.size = counting.network(model, weights=True)
        if data_path.get("formFile"):  # the served form, not the eager model it was built from
            network = imaging.load_serialized(str(data_path["formFile"]), self.device, self.plan.allow_tf32)
        self.path = datapath.plan_data_path(data_path, self.device, self.input.kind, largest)
        self.channels_last = self.path.channels_last
        self.network = imaging.apply_precision(network.to(self.device), self.plan, self.channels_last)
        self.generator = torch.Generator().manual_seed(0)
        try:
            self.per_sample_bytes = ACTIVATION_FACTOR * largest_activation_bytes(self.network, self.batch(1))
        except RuntimeError:  # a TorchScript module takes no Python hooks: no memory estimate, no skip for it
            self.per_sample_bytes = 0
        self.compiled = datapath.compile_model(self.network, self.path)
        self.compiled_sizes: set[int] = set()  # the padded sizes whose graph is compiled
        self.compile_seconds = 0.0
        self.run, self.padded_size = datapath.run_model, datapath.padded_size
        self.device_label = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"

    def batch(self, batch_size: int) -> Any:
        torch = self.torch
        if self.input.kind == "tensor":
            shape, dtype = (batch_size, *(self.input.shape or [])), self.input.dtype or ""
            if dtype.startswith(("float", "bfloat")):
                return torch.randn(*shape, generator=self.generator).to(device=self.device, dtype=self.plan.dtype)
            return torch.zeros(shape, dtype=getattr(torch, dtype), device=self.device)
        shape = (batch_size, 3, self.size, self.size)
        batch = torch.randn(*shape, generator=self.generator).to(device=self.device, dtype=self.plan.dtype)
        return batch.contiguous(memory_format=torch.channels_last) if self.channels_last else batch

    def forward(self, batch: Any) -> float:
        """Seconds of one forward pass, the device synchronised."""
        begun = time.perf_counter()
        self.run(self.compiled, batch, self.path)  # a compiled model's batch padded as the handler pads it
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        return time.perf_counter() - begun

    def measure(self, batch_size: int, share: float) -> RawRow:
        """Uncounted passes until two agree, then timed passes until the next would overrun `share`.

        The uncounted passes are set-up, like the model's load: at most WARM_PASSES of them, begun while they
        have taken less than `share` in all (a model whose one pass is longer than that gets just the first)."""
        batch = self.batch(batch_size)
        compile_seconds = self.compile_first(batch_size, batch)
        warm_started = time.monotonic()
        warm = [self.forward(batch)]  # allocator growth, kernel/algorithm choice, graph optimisation
        while len(warm) < WARM_PASSES and not steady(warm) and time.monotonic() - warm_started + warm[-1] <= share:
            warm.append(self.forward(batch))
        first = warm[-1]
        size_started = time.monotonic()
        passes: list[float] = []
        while first <= share:
            passes.append(self.forward(batch))
            if time.monotonic() - size_started + passes[-1] > share:
                break
        if passes:
            rps, note = best_segment_rps(batch_size, passes), None
        else:
            rps = batch_size / first
            note = f"one pass of {first:.1f} s (first pass included): longer than this size's {share:.1f} s share"
        fastest = min(passes) if passes else first
        return RawRow(batch_size=batch_size, throughput_rps=round(rps, 3), passes=max(len(passes), 1),
                      pass_seconds=round(fastest, 4), compile_seconds=compile_seconds, note=note)  # fmt: skip

    def compile_first(self, batch_size: int, batch: Any) -> float | None:
        """A compiled model's first pass at a padded size it has not run compiles that size's graph (seconds to
        minutes, CUDA graphs recorded too): set-up, as the handler's warm-up is before it serves, so it runs
        here outside the size's share and the budget (:func:`main` adds it). Its seconds, or None."""
        padded = self.padded_size(self.path, batch_size)
        if not self.path.padded_sizes or padded in self.compiled_sizes:
            return None
        seconds = self.forward(batch)
        self.compiled_sizes.add(padded)
        self.compile_seconds += seconds
        return round(seconds, 3)


def steady(passes: list[float]) -> bool:
    """The last two passes took about as long as each other."""
    return len(passes) >= 2 and max(passes[-2:]) <= STEADY_FACTOR * min(passes[-2:])


def skip_reason(probe: Probe, batch_size: int, remaining: float, seconds_per_sample: float | None) -> str | None:
    """Why a batch size cannot be measured now (memory, or the budget left), or None."""
    needed = probe.per_sample_bytes * batch_size
    free = free_memory_bytes(probe.device)
    if needed > MEMORY_FRACTION * free:
        return f"needs about {needed / 2**30:.1f} GiB for activations, {free / 2**30:.1f} GiB free"
    if seconds_per_sample is not None and 2 * seconds_per_sample * batch_size > remaining:  # first + one timed
        estimate = seconds_per_sample * batch_size
        return f"one pass would take about {estimate:.1f} s, {max(remaining, 0):.1f} s of the budget left"
    return None


def main(request: RawRequest) -> None:
    keep_stdout_for_events()
    options = request.data_path
    formed = options.get("batchSize")  # a compiled model's padding goes up to it
    largest = int(formed) if isinstance(formed, int | float | str) else max(request.batch_sizes)
    probe = Probe(request.model, request.precision, request.device, options, largest)
    emit("ready", device=probe.device_label)  # the parent times the setup: start-up and imports included
    sizes = request.batch_sizes
    measure_started = time.monotonic()
    seconds_per_sample: float | None = None  # from the last size measured: estimates the next pass
    for index, batch_size in enumerate(sizes):
        # the budget is for timing: a compiled model's compiles so far extend it
        remaining = measure_started + request.seconds + probe.compile_seconds - time.monotonic()
        if (reason := skip_reason(probe, batch_size, remaining, seconds_per_sample)) is not None:
            emit("skipped", batchSize=batch_size, reason=reason)
            continue
        # The first size (the one the server formed) gets half the budget when others follow.
        later = len(sizes) - index - 1
        share = remaining / 2 if index == 0 and later else remaining / (later + 1)
        emit("start", batchSize=batch_size)
        row = probe.measure(batch_size, share)
        seconds_per_sample = (row.pass_seconds or 0.0) / batch_size
        emit("measured", **row.model_dump(by_alias=True))
    emit("done", measureSeconds=round(time.monotonic() - measure_started, 3))


if __name__ == "__main__":
    main(RawRequest.model_validate_json(sys.argv[1]))
