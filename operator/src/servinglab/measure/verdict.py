"""Why a level measured what it did: one bottleneck verdict from the figures a level already has (pure).

The figures: where a request's time went (the generator's send gap; client latency minus server latency
for the network and the frontend; the server's queue; the handler's preprocess, inference and postprocess
per batch), how busy the workers were (handler time x batches / (workers x window)), the device (the GPU's
busy share from DCGM or NVML; locally without a GPU, the server processes' CPU per second of worker time)
and how batches formed (the mean formed batch against batchSize; throughput x delay against it).

The rules, in order (the first that holds is the verdict; docs/verdicts.md explains each):

1. the generator was saturated (its own judgement, or an open loop that dropped sends) -> generator-bound;
2. served/raw at the formed batch is at least RAW_CEILING -> near-raw-ceiling (its next change: another form
   where one alone is at least FORM_GAIN faster than the served form, before a faster device);
3. the workers were busy (at least BUSY of the window, their handler time with the hand-offs between batches
   that a request spends in the server outside the queue and the handler): the largest stage of their time
   says which —
   preprocess-bound, postprocess-bound, or, when the forward pass is the largest, compute-bound where the
   device is busy and queue-bound (too few workers) where it has room (a server whose stage figures are its
   own execution phases, as its declared worker signals say, counts decoding in the forward pass);
4. otherwise the time outside the workers: frontend-bound when client minus server latency is at least
   FRONTEND of the client's latency; batch-delay-bound when requests waited about the delay in the queue
   while batches stayed below batchSize;
5. otherwise underloaded: the server had room and the load did not ask for more.

Called by :mod:`servinglab.measure.document` (every results document, local or rebuilt from a cluster's
status) and by the operator when it writes a finished experiment's status.
"""

from __future__ import annotations

from collections.abc import Sequence

from servinglab.api.ceiling import Ceiling
from servinglab.api.results import LevelResult, ServerSettings
from servinglab.api.servers import CAPABILITIES, WorkerSignal
from servinglab.api.verdicts import (
    BatchFormation,
    Bottleneck,
    DeviceLoad,
    TimeSplit,
    Verdict,
    VerdictHint,
    WorkerLoad,
)

#: Workers busy at least this share of the window are the server's limit.
BUSY = 0.75
#: Served/raw at the formed batch at least this: the server adds little to the model alone.
RAW_CEILING = 0.85
#: Client minus server latency at least this share of the client's: the frontend or the network.
FRONTEND = 0.5
#: A device has room for another worker when its busy share, grown by one worker's share (busy x (w+1)/w),
#: stays at most this: a GPU by its utilisation, the CPU by the cores the workers used or waited for (of
#: those the server may use). The workers then wait on something else, or leave cores idle, and one more
#: would overlap the waits or use them.
DEVICE_ROOM = 0.9
#: A formed batch at least this share of batchSize is at the maximum.
FULL = 0.95
#: Requests that queued beyond the delay at least this share of a batch's handler time waited for a worker.
WAITED = 0.25
#: An open loop that dropped more than this share of its sends could not offer the load.
DROPPED = 0.01
#: Near the raw ceiling, another form alone at least this much faster than the served one is the next change.
FORM_GAIN = 1.15

WORKERS_UP = VerdictHint(axis="workers", step=1)
BATCH_UP = VerdictHint(axis="batchSize", step=1)
DELAY_UP = VerdictHint(axis="maxBatchDelayMs", step=1)
DELAY_DOWN = VerdictHint(axis="maxBatchDelayMs", step=-1)
#: The handler's data path (decode on the device or a thread pool): a server's own axis, where it has one.
DECODE = VerdictHint(axis="decode", step=1)


def _pct(value: float) -> str:
    return f"{value:.0%}"


def time_split(level: LevelResult) -> TimeSplit:
    """Per request, in ms: the client's latency and the parts of it the counters account for."""
    server, client = level.server, level.latency_ms.mean
    gap = level.generator.send_gap_ms if level.generator is not None else None
    if server is None:
        return TimeSplit(client_ms=client, generator_ms=gap.p50 if gap else None)
    in_server = server.server_latency_ms_mean
    stages = (server.preprocess_ms_per_batch, server.inference_ms_per_batch, server.postprocess_ms_per_batch)
    handler = sum(stage for stage in stages if stage is not None) if any(s is not None for s in stages) else None
    outside = None if client is None or in_server is None else round(max(client - in_server, 0.0), 3)
    batching = None
    if in_server is not None and handler is not None:
        batching = round(max(in_server - (server.queue_ms_mean or 0.0) - handler, 0.0), 3)
    return TimeSplit(
        client_ms=client, generator_ms=gap.p50 if gap else None, network_frontend_ms=outside,
        queue_ms=server.queue_ms_mean, preprocess_ms=stages[0], inference_ms=stages[1], postprocess_ms=stages[2],
        batching_ms=batching,
    )  # fmt: skip


def worker_load(level: LevelResult, workers: int) -> WorkerLoad:
    server = level.server
    stages = [] if server is None else [server.preprocess_ms_per_batch, server.inference_ms_per_batch,
                                        server.postprocess_ms_per_batch]  # fmt: skip
    known = [stage for stage in stages if stage is not None]
    if server is None or not known or not server.batches or not level.window_seconds:
        return WorkerLoad(workers=workers)
    handler = sum(known)
    busy = handler * server.batches / (workers * level.window_seconds * 1000)
    return WorkerLoad(workers=workers, busy_fraction=round(busy, 3), handler_ms_per_batch=round(handler, 3))


def device_load(level: LevelResult, workers: WorkerLoad, gpu_source: str | None) -> DeviceLoad | None:
    """The GPU's figures where there are any; else the server's CPU (a local run without a GPU)."""
    gpu = level.gpu
    if gpu is not None and gpu.utilization_avg_percent is not None:
        return DeviceLoad(
            kind="gpu", source=gpu_source, busy_fraction=round(gpu.utilization_avg_percent / 100, 3),
            memory_used_max_mib=gpu.memory_used_max_mib, power_avg_watts=gpu.power_avg_watts,
            energy_per_inference_joules=gpu.energy_per_inference_joules,
        )  # fmt: skip
    cpu = level.cpu
    if cpu is None:
        return None
    per_busy = None
    demand = cpu.cores_wanted if cpu.cores_wanted is not None else cpu.cores_busy
    if workers.busy_fraction:
        per_busy = round(demand / (workers.busy_fraction * workers.workers), 3)
    source = "the workers' CPU time" + (" and run-queue waits" if cpu.cores_wanted is not None else "")
    return DeviceLoad(
        kind="cpu", source=source, busy_fraction=round(min(demand / max(cpu.cores, 1), 1.0), 3),
        compute_per_busy_second=per_busy,
    )  # fmt: skip


def batch_formation(level: LevelResult, batch_size: int, delay_ms: int, workers: int) -> BatchFormation:
    """The formed batch against batchSize, and what sets it: full batches; the requests in flight (a closed
    loop's users); requests that queued for a busy worker (many more than arrive within the delay); or the
    delay itself (about what arrives within it)."""
    formed = level.server.mean_batch_size if level.server is not None else None
    arrivals = round(level.throughput_rps * delay_ms / 1000, 3)
    if formed is None:
        return BatchFormation(maximum=batch_size, arrivals_per_delay=arrivals)
    fill = formed / batch_size
    users = level.concurrency
    if fill >= FULL:
        by, note = "maximum", f"at the maximum ({formed:.3g} of {batch_size}): a larger batch may serve more"
    elif users is not None and formed >= 0.8 * users / workers:
        by = "load"
        note = (f"of {formed:.3g} hold nearly every request in flight ({users} users over {workers} worker(s)): "
                "more load forms larger batches")  # fmt: skip
    elif formed >= 2 * arrivals:
        by = "queue"
        note = (f"of {formed:.3g} form from requests queued for a busy worker ({arrivals:.3g} arrive within the "
                f"{delay_ms} ms delay): the delay is not what forms them")  # fmt: skip
    elif arrivals >= 2 * formed:
        by = "unclear"
        note = (f"of {formed:.3g} form while {arrivals:.3g} requests arrive within the {delay_ms} ms delay: "
                "the delay is not what forms batches")  # fmt: skip
    else:
        by = "delay"
        note = f"of {formed:.3g} are what the {delay_ms} ms delay gathers: a longer delay would form larger ones"
    return BatchFormation(formed=formed, maximum=batch_size, fill=round(fill, 3), arrivals_per_delay=arrivals,
                          formed_by=by, note=note)  # fmt: skip


def served_over_raw(level: LevelResult, ceiling: Ceiling | None) -> float | None:
    """The level's throughput over the model alone at the batch it formed (where the raw probe measured it)."""
    if ceiling is None or not ceiling.raw_table or level.server is None or level.server.mean_batch_size is None:
        return None
    formed = max(1, round(level.server.mean_batch_size))
    row = next((row for row in ceiling.raw_table if row.batch_size == formed), None)
    return round(level.throughput_rps / row.throughput_rps, 3) if row is not None and row.throughput_rps else None


def _compute_hints(batch: BatchFormation) -> list[VerdictHint]:
    """A busy model: a longer delay where the delay forms the batches, else a larger batch."""
    return [DELAY_UP, BATCH_UP] if batch.formed_by == "delay" else [BATCH_UP]


def occupied_fraction(split: TimeSplit, load: WorkerLoad) -> float | None:
    """The workers' share of the window with the hand-offs: a batch passes from the frontend to a worker and
    back (`batching_ms`, a request's time in the server outside the queue and the handler) before the worker
    takes the next, so that time is part of each worker's cycle even though the handler's counters miss it.
    On a contended host the frontend's hand-offs reached 10 ms a batch beside a 27 ms handler."""
    busy, handler = load.busy_fraction, load.handler_ms_per_batch
    if busy is None or not handler:
        return busy
    return round(busy * (handler + (split.batching_ms or 0.0)) / handler, 3)


def _workers_limit(split: TimeSplit, load: WorkerLoad, batch: BatchFormation, delay_ms: int) -> bool:
    """Workers occupied at least BUSY of the window limit the level unless their batches hold every request in
    flight and none waited for a worker beyond the delay: then too little load keeps them busy with small
    batches."""
    occupied = occupied_fraction(split, load)
    if occupied is None or occupied < BUSY:
        return False
    if batch.formed_by != "load":
        return True
    waited = (split.queue_ms or 0.0) - delay_ms
    return waited >= WAITED * (load.handler_ms_per_batch or 0.0)


def _busy_verdict(split: TimeSplit, load: WorkerLoad, device: DeviceLoad | None, batch: BatchFormation,
                  handler_stages: bool = True) -> Verdict:  # fmt: skip
    """Busy workers: the largest stage of their time, and for the forward pass whether the device has room.
    Without `handler_stages` the server times its own execution phases: decoding is in the model's execution."""
    stages = {"preprocess": split.preprocess_ms or 0.0, "inference": split.inference_ms or 0.0,
              "postprocess": split.postprocess_ms or 0.0}  # fmt: skip
    handler = sum(stages.values()) or 1.0
    largest = max(stages, key=lambda name: stages[name])
    share = stages[largest] / handler
    busy = f"workers busy {_pct(load.busy_fraction or 0)} of the window"
    if (load.busy_fraction or 0) < BUSY:
        busy += (f", {_pct(occupied_fraction(split, load) or 0)} with the {split.batching_ms or 0:.1f} ms a batch "
                 "spent handed between the frontend and them")  # fmt: skip
    workers = f"{load.workers} worker(s)"
    if largest == "preprocess":
        return Verdict(
            bottleneck=Bottleneck.PREPROCESS,
            because=f"{busy}; preprocess {_pct(share)} of their time ({stages[largest]:.1f} ms per batch)",
            next="take input decoding off the worker's CPU (decode on the device or in a thread pool), send smaller "
            f"inputs, or more workers than {workers} while CPU cores are free",
            hints=[DECODE, WORKERS_UP],
        )
    if largest == "postprocess":
        return Verdict(
            bottleneck=Bottleneck.POSTPROCESS,
            because=f"{busy}; postprocess {_pct(share)} of their time ({stages[largest]:.1f} ms per batch)",
            next=f"lighter responses (fewer top-k classes, smaller outputs), or more workers than {workers}",
            hints=[WORKERS_UP],
        )
    what = "the forward pass" if handler_stages else "the model's execution (decoding included)"
    forward = f"{busy}; {what} {_pct(share)} of their time ({stages[largest]:.1f} ms per batch)"
    room = _device_room(device, load.workers)
    if room is not None:
        return Verdict(
            bottleneck=Bottleneck.QUEUE,
            because=f"{forward}; requests queued {split.queue_ms or 0:.1f} ms while {room}",
            next=f"more workers than {workers}: each waits on its forward pass while the device has room",
            hints=[WORKERS_UP],
        )
    busy_device = _device_busy(device)
    batch_note = f"; batches {batch.note}" if batch.note else ""
    return Verdict(
        bottleneck=Bottleneck.COMPUTE,
        because=f"{forward}{busy_device}{batch_note}",
        next="a larger batch where batches are full, a longer delay where the delay forms them; a lower precision, "
        "a compiled model or a faster device",
        hints=_compute_hints(batch),
    )


def _device_room(device: DeviceLoad | None, workers: int) -> str | None:
    """Why the device has room for one more worker, when it does (None: busy, or unknown)."""
    if device is None or device.busy_fraction is None:
        return None
    if device.busy_fraction * (workers + 1) / workers > DEVICE_ROOM:
        return None
    if device.kind == "gpu":
        return f"the GPU was busy only {_pct(device.busy_fraction)}"
    return f"the workers used or waited for only {_pct(device.busy_fraction)} of the CPU cores"


def _device_busy(device: DeviceLoad | None) -> str:
    if device is None:
        return "; device utilisation unknown (no GPU figures, no CPU figures)"
    if device.kind == "gpu":
        return f"; the GPU busy {_pct(device.busy_fraction or 0)}"
    return (f"; the workers used or waited for {_pct(device.busy_fraction or 0)} of the CPU cores "
            f"({device.compute_per_busy_second or 0:.2f} cores per second they were busy)")  # fmt: skip


def _idle_verdict(split: TimeSplit, load: WorkerLoad, batch: BatchFormation, delay_ms: int) -> Verdict:
    """Workers with room: where the client's time went outside them."""
    client = split.client_ms or 0.0
    busy = f"workers busy {_pct(load.busy_fraction)} of the window" if load.busy_fraction is not None else (
        "worker time unknown (no handler counters)")  # fmt: skip
    outside = split.network_frontend_ms
    if client > 0 and outside is not None and outside >= FRONTEND * client:
        return Verdict(
            bottleneck=Bottleneck.FRONTEND,
            because=f"{busy}; {outside:.1f} ms of the client's {client:.1f} ms is outside the server's own latency "
            f"(network and frontend, {_pct(outside / client)})",
            next="a lighter request path: smaller payloads, fewer and larger requests, the frontend's threads, "
            "or generators nearer the server",
        )
    queue = split.queue_ms or 0.0
    unfilled = batch.fill is None or batch.fill < FULL
    if client > 0 and queue >= 0.5 * delay_ms and queue >= 0.3 * client and unfilled:
        formed = f"batches of {batch.formed:.3g} of {batch.maximum}" if batch.formed is not None else "batches"
        return Verdict(
            bottleneck=Bottleneck.BATCH_DELAY,
            because=f"{busy}; requests waited {queue:.1f} ms in the queue ({_pct(queue / client)} of the client's "
            f"latency) for a {delay_ms} ms batch delay; {formed}",
            next=f"a shorter maxBatchDelayMs than {delay_ms} (batches do not fill at this load), or more load",
            hints=[DELAY_DOWN],
        )
    if load.busy_fraction is None:
        return Verdict(bottleneck=Bottleneck.UNKNOWN, because=f"{busy}; nothing outside the workers stands out",
                       next="serve the model with servinglab's handler so its workers' time is counted")  # fmt: skip
    return Verdict(
        bottleneck=Bottleneck.UNDERLOADED,
        because=f"{busy}; queue {queue:.1f} ms of the client's {client:.1f} ms"
        + (f"; batches {batch.note}" if batch.note else ""),
        next="more load (more users or a higher rate) to find what this configuration can serve",
    )


def judge(level: LevelResult, server: ServerSettings, ceiling: Ceiling | None = None,
          gpu_source: str | None = None) -> Verdict:  # fmt: skip
    """The verdict of one level served with `server`'s settings (`ceiling`: the experiment's raw figures)."""
    workers, batch_size = server.workers or 1, server.batch_size or 1
    delay_ms = server.max_batch_delay_ms or 0
    split, load = time_split(level), worker_load(level, workers)
    device = device_load(level, load, gpu_source)
    batch = batch_formation(level, batch_size, delay_ms, workers)
    raw = served_over_raw(level, ceiling)
    parts = {"time_ms": split, "workers": load, "device": device, "batch": batch, "served_over_raw": raw}
    dropped = level.open_loop.dropped_sends / max(level.open_loop.late_sends + level.requests, 1) if (
        level.open_loop is not None) else 0.0  # fmt: skip
    if level.generator_limited or dropped > DROPPED:
        why = level.generator.reason if level.generator is not None and level.generator.reason else None
        because = why or f"the open loop dropped {_pct(dropped)} of its sends"
        return Verdict(
            bottleneck=Bottleneck.GENERATOR, because=f"the load generator limited this level: {because}",
            next="more load generators (load.generators) or a lighter response check: the server's figures here are "
            "a lower bound", **parts,
        )  # fmt: skip
    if raw is not None and raw >= RAW_CEILING:
        formed = batch.formed or 0
        bigger = ceiling is not None and (ceiling.raw_best_batch_size or 0) > round(formed)
        form = _better_form(ceiling)
        return Verdict(
            bottleneck=Bottleneck.RAW_CEILING,
            because=f"served {level.throughput_rps:.1f} rps = {_pct(raw)} of the model alone at the formed batch "
            f"{formed:.3g}",
            next=form[0] if form is not None else "the server adds little: a larger batch where the model alone is "
            "faster there, else a lower precision, a compiled model or a faster device",
            hints=([form[1]] if form is not None else []) + ([BATCH_UP] if bigger else []), **parts,
        )  # fmt: skip
    if level.server is None or split.client_ms is None:
        return Verdict(bottleneck=Bottleneck.UNKNOWN, because="no server breakdown for this level",
                       next="serve the model with servinglab's handler so its counters are read", **parts)  # fmt: skip
    if _workers_limit(split, load, batch, delay_ms):
        found = _busy_verdict(split, load, device, batch, _times_handler_stages(server.kind))
    else:
        found = _idle_verdict(split, load, batch, delay_ms)
    return found.model_copy(update=parts)


def _times_handler_stages(kind: str | None) -> bool:
    """Whether the server's stage figures are the handler's own (its declared worker signals); a kind not
    known here (an older document's) is taken to time them."""
    declared = CAPABILITIES.get(kind or "")
    return declared is None or WorkerSignal.HANDLER_STAGES in declared.worker_signals


def _better_form(ceiling: Ceiling | None) -> tuple[str, VerdictHint] | None:
    """Near the raw ceiling: the form alone that is at least FORM_GAIN faster than the served one, as the next
    change to try (what to say, and the sweep's hint), or None."""
    better = ceiling.best_form if ceiling is not None else None
    if better is None or better.form == better.served_form or better.gain < FORM_GAIN:
        return None
    say = (f"near the raw ceiling in {better.served_form} form: the {better.form} form alone runs {better.gain:.2g}x "
           f"faster at this batch; try server.form: {better.form} (before a faster device)")  # fmt: skip
    return say, VerdictHint(axis="form", step=1, value=better.form)


def judged(levels: Sequence[LevelResult], server: ServerSettings, ceiling: Ceiling | None = None,
           gpu_source: str | None = None) -> list[LevelResult]:  # fmt: skip
    """The levels, each with its verdict."""
    return [level.model_copy(update={"verdict": judge(level, server, ceiling, gpu_source)}) for level in levels]
