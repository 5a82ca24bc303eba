"""Reading a local TorchServe's log files: why its workers could not load the model, and what
servinglab's handler said of how the current registration runs (precision, data path, warm-up).

Called by :mod:`servinglab.servers.torchserve.local` alone. TorchServe copies each worker's output into
model_log.log on a thread of its own, apart from the thread that marks the worker ready, so a worker can
be ready before its lines are in the file: :func:`registration_notes` waits for them, bounded. TorchServe
also rolls its logs (at 100 MB, and daily): a :class:`Mark` notices that its file was replaced.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from servinglab.servers.base import RuntimeNotes
from servinglab.servers.handler import WARMUP_NOTE, handler_notes
from servinglab.servers.torchserve.launcher import LOAD_ATTEMPTS, LOAD_FAILED, WORKER_DIED

logger = logging.getLogger(__name__)

#: A model-log line carrying an exception ("MODEL_LOG - AttributeError: ...").
_EXCEPTION = re.compile(r"MODEL_LOG - [A-Za-z_.]*(Error|Exception): ")
#: The worker a model-log line came from ("... W-9001-tiny_1.0-stdout MODEL_LOG - ...").
_WORKER = re.compile(r" W-(\d+)-")


class Mark(NamedTuple):
    """Where a log stood: its file (inode) and size. Reading from a mark reads what came after it."""

    inode: int = 0
    size: int = 0


def mark(log: Path) -> Mark:
    """Where `log` stands now (an empty mark while it does not exist)."""
    try:
        found = log.stat()
    except FileNotFoundError:
        return Mark()
    return Mark(found.st_ino, found.st_size)


def read_from(log: Path, since: Mark) -> str:
    """The whole lines `log` gained after `since` ("" while it does not exist); all of it when the file was
    rolled over since (another inode, or shorter). A last line still being written waits for the next read."""
    try:
        with log.open("rb") as handle:
            found = os.fstat(handle.fileno())  # the file opened, whatever the name points at by now
            offset = since.size if (found.st_ino == since.inode and found.st_size >= since.size) else 0
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:  # between a roll's rename and the new file
        return ""
    return text[: text.rfind("\n") + 1]


def registration_notes(
    model_log: Path, since: Mark, workers: int, wait_seconds: float, check_alive: Callable[[], None]
) -> RuntimeNotes:
    """What the `workers` registered after `since` logged (:func:`~servinglab.servers.handler.handler_notes`),
    once each has logged its warm-up (the last line of servinglab's handler in TorchServe) or `wait_seconds`
    have passed (0 for an archive's own handler, which says none of this), calling `check_alive` between
    reads. A worker restarted meanwhile logs twice: the workers are counted, not the lines."""
    deadline = time.monotonic() + wait_seconds
    text = read_from(model_log, since)
    while _warmed_up(text) < workers and time.monotonic() < deadline:
        check_alive()
        time.sleep(0.1)
        text = read_from(model_log, since)
    if wait_seconds > 0 and (warmed := _warmed_up(text)) < workers:
        logger.warning("%d of %d TorchServe workers logged their warm-up within %.0f s (%s): the results' "
                       "runtime notes may be incomplete", warmed, workers, wait_seconds, model_log)  # fmt: skip
    return handler_notes(text, workers)


def _warmed_up(text: str) -> int:
    """How many workers logged a warm-up in `text`."""
    return len({found.group(1) for line in text.splitlines() if WARMUP_NOTE in line if (found := _WORKER.search(line))})


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
