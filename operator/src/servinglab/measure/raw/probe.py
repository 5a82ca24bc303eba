"""Run :mod:`servinglab.measure.raw.child` as a child process and collect its figures, with progress,
prompt interruption and a cache shared by the trials of a sweep.

Called by the local runner after the server has stopped and by benchmarks. The
parent never imports torch. While the child runs, the parent reads its lines with a one-second
select (cooperative under gevent, so the runner's SIGINT/SIGTERM handler still runs), reports which
batch size is being measured and for how long, and on any exception — an interrupt included — kills
the child's whole process group before re-raising. The child runs under a watchdog
(:mod:`servinglab.lifeline`), so it goes too when the parent dies without a chance to kill it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from servinglab import lifeline
from servinglab.api.ceiling import FormAlone
from servinglab.measure.raw.figures import RawCache, RawFigures
from servinglab.measure.raw.protocol import (
    EVENT,
    Done,
    Event,
    Form,
    FormsRequest,
    Measured,
    RawRequest,
    Ready,
    Skipped,
    Start,
)

#: Seconds between "still measuring" progress messages during one long pass.
HEARTBEAT_SECONDS = 10.0


class RawProbeError(RuntimeError):
    """The child failed; the message carries the end of its stderr."""


def measure(
    model: str,
    precision: str,
    device: str,
    batch_sizes: list[int],
    seconds: float,
    progress: Callable[[str], None] = lambda message: None,
    cache: RawCache | None = None,
    model_options: Mapping[str, Any] | None = None,
) -> RawFigures:
    """Raw throughput at `batch_sizes` (first one first, the rest as the budget allows). `model_options` are
    the data path's settings that change the model itself (`compile`, `channelsLast`), applied as the
    handler applies them, so served/raw compares the same model."""
    cache = cache if cache is not None else RawCache()
    options = dict(model_options or {})
    variant = json.dumps(options, sort_keys=True)
    keys = {b: (model, precision, device, b, variant) for b in batch_sizes}
    known = {b: cache.rows[key] for b, key in keys.items() if key in cache.rows}
    skipped = {b: cache.skipped[key] for b, key in keys.items() if key in cache.skipped}
    wanted = [b for b in batch_sizes if b not in known and b not in skipped]
    figures = RawFigures(cache.device_names.get(device, device), dict(known), skipped, from_cache=sorted(known))
    if not wanted:
        return figures
    request = RawRequest(model=model, precision=precision, device=device, batch_sizes=wanted, seconds=seconds,
                         data_path=options)  # fmt: skip
    spawned = time.monotonic()  # spawned at the first event read: the setup includes the watchdog's and child's start
    for event in _child_events(request, progress):
        if isinstance(event, Ready):
            figures.device, figures.setup_seconds = event.device, round(time.monotonic() - spawned, 3)
            cache.device_names[device] = event.device
        elif isinstance(event, Measured):
            row = event.row()
            figures.measured[row.batch_size] = row
            cache.rows[(model, precision, device, row.batch_size, variant)] = row
        elif isinstance(event, Skipped):
            figures.skipped[event.batch_size] = event.reason
            cache.skipped[(model, precision, device, event.batch_size, variant)] = event.reason
        elif isinstance(event, Done):
            figures.measure_seconds = event.measure_seconds
    return figures


def measure_forms(
    model: str, precision: str, device: str, batch_size: int, forms: list[str], seconds: float, cache_dir: str,
    progress: Callable[[str], None] = lambda message: None,
) -> list[FormAlone]:  # fmt: skip
    """The model alone in each of `forms` at `batch_size` (:mod:`servinglab.measure.raw.forms`: built or found
    built under `cache_dir`, gated against eager fp32, timed for `seconds`), in the order given."""
    request = FormsRequest(model=model, precision=precision, device=device, forms=forms, batch_size=batch_size,
                           seconds=seconds, cache_dir=cache_dir)  # fmt: skip
    found = []
    progress(f"Ceiling: the model alone in each form ({', '.join(forms)}) at batch {batch_size}")
    for event in _child_events(request, progress, "servinglab.measure.raw.forms"):
        if isinstance(event, Form):
            found.append(FormAlone.model_validate(event.model_dump(exclude={"event"})))
            progress(f"Ceiling: form {event.form} alone: {event.status}")
    return found


def _child_events(request: RawRequest | FormsRequest, progress: Callable[[str], None],
                  module: str = "servinglab.measure.raw.child") -> Iterator[Event]:  # fmt: skip
    """The child's events, each line validated as it is read."""
    errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed in finally) a file, not a pipe: never blocks the child
    guard = lifeline.spawn(  # its own group, ended at once (no grace) when we stop it or die
        [sys.executable, "-m", module, request.argument()],
        grace_seconds=0,
        stdout=subprocess.PIPE,
        stderr=errors,
    )
    child = guard.process  # the watchdog: the child's output passes through, its exit status is the child's
    assert child.stdout is not None
    try:
        buffer, current, since, last_note = b"", None, time.monotonic(), time.monotonic()
        while True:
            readable, _, _ = select.select([child.stdout], [], [], 1.0)
            if readable:
                chunk = os.read(child.stdout.fileno(), 65536)
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    event = EVENT.validate_json(line)
                    if isinstance(event, Start):
                        current, since = event.batch_size, time.monotonic()
                        last_note = since
                        progress(f"Ceiling: model alone at batch {current}")
                    yield event
            elif current is not None and time.monotonic() - last_note >= HEARTBEAT_SECONDS:
                progress(f"Ceiling: still at batch {current}, {time.monotonic() - since:.0f} s so far")
                last_note = time.monotonic()
        if (status := guard.wait()) != 0:
            errors.seek(0)
            tail = errors.read().decode(errors="replace").strip().splitlines()[-8:]
            raise RawProbeError(f"the raw-throughput probe exited with {status}: " + "\n".join(tail))
    finally:
        guard.stop()
        child.stdout.close()
        errors.close()
