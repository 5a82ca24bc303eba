"""What a local TorchServe's model log says of the current registration: read from where it began, once
TorchServe's copying thread has caught up with the workers (it may lag behind their readiness)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from servinglab.servers.handler import DATA_PATH_NOTE, PRECISION_NOTE, WARMUP_NOTE
from servinglab.servers.torchserve.logs import load_failure, mark, registration_notes


def worker_lines(worker: int, threads: int, warmup_seconds: float) -> str:
    """The lines TorchServe writes for one worker of servinglab's handler, as it writes them."""
    prefix = f"2026-11-26T22:27:58,744 [INFO ] W-{9000 + worker}-tiny_1.0-stdout MODEL_LOG - "
    path = {"decode": "cpu", "decodeThreads": threads, "transfer": "uint8", "pinnedCopies": False,
            "compile": "none", "channelsLast": False, "paddedBatchSizes": []}  # fmt: skip
    warmup = {"seconds": warmup_seconds, "batchSizes": [1, 2], "skipped": [], "budgetSeconds": 60.0}
    return (
        f"{prefix}{PRECISION_NOTE} fp32 runs natively on CPU\n"
        f"{prefix}{DATA_PATH_NOTE} {json.dumps(path)}\n"
        f"{prefix}{WARMUP_NOTE} {json.dumps(warmup)}\n"
    )


def never_dies() -> None:
    pass


@pytest.mark.parametrize("copied", ["a timestamp", "all but the end of the last warm-up"])
def test_the_notes_are_the_current_registrations_even_when_its_lines_arrive_after_the_workers_are_ready(
    copied: str, tmp_path: Path
) -> None:
    log = tmp_path / "model_log.log"
    log.write_text(worker_lines(0, 1, 0.5) + worker_lines(1, 1, 0.7))  # the previous registration's workers
    registered_at = mark(log)
    new = worker_lines(2, 4, 0.2) + worker_lines(3, 4, 0.3)
    cut = 40 if copied == "a timestamp" else new.rindex('"budgetSeconds"')  # a line cut mid-JSON is not read
    with log.open("a") as handle:  # the workers are ready; TorchServe has copied only part of what they said
        handle.write(new[:cut])

    def copy_the_rest() -> None:
        time.sleep(0.5)
        with log.open("a") as handle:
            handle.write(new[cut:])

    late = threading.Thread(target=copy_the_rest)
    late.start()
    notes = registration_notes(log, registered_at, 2, 10.0, never_dies)
    late.join()
    assert notes.data_path is not None and notes.data_path.decode_threads == 4
    assert notes.warmup is not None and notes.warmup.seconds == pytest.approx(0.3)  # the slower new worker's
    assert notes.precision_note == "fp32 runs natively on CPU"


def test_a_worker_restarted_before_the_others_lines_arrive_is_counted_once(tmp_path: Path) -> None:
    log = tmp_path / "model_log.log"
    log.write_text("")
    registered_at = mark(log)
    log.write_text(worker_lines(2, 4, 0.2) + worker_lines(2, 4, 0.25))  # worker 2, and worker 2 again

    def copy_the_other() -> None:
        time.sleep(0.5)
        with log.open("a") as handle:
            handle.write(worker_lines(3, 4, 0.9))

    late = threading.Thread(target=copy_the_other)
    late.start()
    notes = registration_notes(log, registered_at, 2, 10.0, never_dies)
    late.join()
    assert notes.warmup is not None and notes.warmup.seconds == pytest.approx(0.9)


def test_a_log_rolled_over_since_the_registration_is_read_from_its_start(tmp_path: Path) -> None:
    """TorchServe rolls model_log.log at 100 MB and daily: the mark's offset means nothing in the new file."""
    log = tmp_path / "model_log.log"
    log.write_text(worker_lines(0, 1, 0.5) * 20)
    registered_at = mark(log)
    log.rename(tmp_path / "model_log.2026-11-26.log")
    log.write_text(worker_lines(1, 4, 0.3))  # shorter than the offset
    notes = registration_notes(log, registered_at, 1, 10.0, never_dies)
    assert notes.data_path is not None and notes.data_path.decode_threads == 4


def test_lines_that_never_come_end_the_wait_and_an_archives_own_handler_is_not_waited_for(tmp_path: Path) -> None:
    log = tmp_path / "model_log.log"
    log.write_text(worker_lines(0, 4, 0.5))
    started = time.monotonic()
    notes = registration_notes(log, mark(log), 1, 0.3, never_dies)
    assert notes.data_path is None and notes.warmup is None  # never the previous registration's
    assert registration_notes(log, mark(log), 1, 0.0, never_dies).data_path is None
    assert time.monotonic() - started < 5


def test_a_server_that_dies_while_its_notes_are_awaited_ends_the_wait(tmp_path: Path) -> None:
    log = tmp_path / "model_log.log"

    def died() -> None:
        raise RuntimeError("TorchServe exited with code 1")

    with pytest.raises(RuntimeError, match="exited"):
        registration_notes(log, mark(log), 1, 30.0, died)


def test_a_model_that_cannot_load_is_told_by_its_attempts_or_by_its_workers_deaths() -> None:
    failed = "MODEL_LOG - Failed to load model tiny, exception ValueError: no weights\n"
    assert load_failure("tiny", failed, "") is None  # TorchServe tries again
    assert load_failure("tiny", failed * 2, "") == (2, "ValueError: no weights")
    died = "Load model failed: tiny, error: Worker died.\n"
    assert load_failure("tiny", "MODEL_LOG - ModuleNotFoundError: No module named 'x'\n", died * 2) == (
        2, "ModuleNotFoundError: No module named 'x'",
    )  # fmt: skip
