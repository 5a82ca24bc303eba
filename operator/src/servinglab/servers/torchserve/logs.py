"""Reading a local TorchServe's log files: why its workers could not load the model, and what
servinglab's handler said of how the current registration runs (precision, data path, warm-up).

Called by :mod:`servinglab.servers.torchserve.local` alone. TorchServe copies each worker's output into
model_log.log on a thread of its own, apart from the thread that marks the worker ready, so a worker can
be ready before its lines are in the file: :func:`registration_notes` waits for them, bounded.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from servinglab.servers.base import RuntimeNotes
from servinglab.servers.handler import WARMUP_NOTE, handler_notes, statements
from servinglab.servers.torchserve.launcher import LOAD_ATTEMPTS, LOAD_FAILED, WORKER_DIED

#: A model-log line carrying an exception ("MODEL_LOG - AttributeError: ...").
_EXCEPTION = re.compile(r"MODEL_LOG - [A-Za-z_.]*(Error|Exception): ")


def size_of(log: Path) -> int:
    """The log's size in bytes (0 while it does not exist): where reading "from now on" starts."""
    return log.stat().st_size if log.exists() else 0


def read_from(log: Path, offset: int) -> str:
    """The whole lines `log` gained after `offset` bytes ("" while it does not exist); a last line still
    being written is left for the next read."""
    if not log.exists():
        return ""
    with log.open("rb") as handle:
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    return text[: text.rfind("\n") + 1]


def registration_notes(
    model_log: Path, offset: int, workers: int, wait_seconds: float, check_alive: Callable[[], None]
) -> RuntimeNotes:
    """What the `workers` registered after `offset` logged (:func:`~servinglab.servers.handler.handler_notes`),
    once each has logged its warm-up (the handler's last line) or `wait_seconds` have passed (0 for an
    archive's own handler, which says none of this), calling `check_alive` between reads."""
    deadline = time.monotonic() + wait_seconds
    text = read_from(model_log, offset)
    while len(statements(text, WARMUP_NOTE)) < workers and time.monotonic() < deadline:
        check_alive()
        time.sleep(0.1)
        text = read_from(model_log, offset)
    return handler_notes(text, workers)


def load_failure(model_name: str, model_text: str, ts_text: str) -> tuple[int, str] | None:
    """(attempts, cause) when the workers cannot load the model, from what the model log and ts_log
    gained since the registration; None while they may still. Either initialize() raised (the model log
    says so) or the handler could not even be imported (the frontend logs the worker's death; the model
    log ends with the exception)."""
    failures = [line.split(LOAD_FAILED, 1)[1] for line in model_text.splitlines() if LOAD_FAILED in line]
    if len(failures) >= LOAD_ATTEMPTS:
        return len(failures), failures[-1].split(", exception ", 1)[-1].strip()
    died = ts_text.count(WORKER_DIED.format(model=model_name))
    if died < LOAD_ATTEMPTS:
        return None
    errors = [line.split("MODEL_LOG - ", 1)[1] for line in model_text.splitlines() if _EXCEPTION.search(line)]
    return died, errors[-1].strip() if errors else "the worker died while loading the handler"
