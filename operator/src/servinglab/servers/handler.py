"""What servinglab's handler (`handlers/`) is told by every server: the precision, the batch sizes each
worker warms up within its budget, how many classes an answer lists, and its data path. The same for every server kind,
so a model runs the same way whichever server serves it (pure; TorchServe puts these settings in its
model-config.yaml, LitServe in the script that starts it). And what it says back: each local server's
notes() reads its workers' lines with :func:`handler_notes`.
"""

from __future__ import annotations

from servinglab.api import LoadSpec, ServerSpec
from servinglab.api.results import DataPathRun, Warmup
from servinglab.servers.base import RuntimeNotes

#: The classes an image classifier's answer lists.
TOP_K = 5

#: How the handler's log lines about a worker begin (each server's notes() reads them back): the
#: precision as realised, the data path as run (JSON) and the warm-up (JSON; in TorchServe the last line).
PRECISION_NOTE, DATA_PATH_NOTE, WARMUP_NOTE = "servinglab precision:", "servinglab data path:", "servinglab warm-up:"


def powers_of_two_up_to(largest: int) -> list[int]:
    """1, 2, 4, ... below `largest`, and `largest` itself: the batch sizes warmed up and scanned."""
    return sorted({min(2**i, largest) for i in range(largest.bit_length() + 1)})


def warmup_batch_sizes(batch_size: int, load: LoadSpec | None) -> list[int]:
    """The batch sizes a worker warms up: powers of two up to the largest batch the load can form.
    A closed loop never has more requests outstanding than its largest concurrency; an open loop
    can fill any batch up to the configured size."""
    largest = batch_size
    if load is not None and load.mode == "closed":
        largest = min(batch_size, max(load.concurrency))
    return powers_of_two_up_to(largest)


def handler_settings(server: ServerSpec, load: LoadSpec | None = None) -> dict[str, object]:
    """The handler's settings (its `load()` takes them as they are)."""
    return {
        "precision": str(server.precision),
        # the sizes the load can form, also with no warm-up (0 s): a compiled model still compiles them first
        "warmupBatchSizes": warmup_batch_sizes(server.batch_size, load),
        "warmupSeconds": server.warmup_seconds,
        "topK": TOP_K,
        "dataPath": server.data_path.model_copy(update={"compile": server.compile_mode()}).handler_settings(),
        **({"form": str(server.form)} if server.form is not None else {}),
    }


def statements(text: str, marker: str) -> list[str]:
    """What the handler said after `marker` (PRECISION_NOTE, ...) in a log's `text`, oldest first."""
    return [line.split(marker, 1)[1].strip() for line in text.splitlines() if marker in line]


def handler_notes(text: str, workers: int) -> RuntimeNotes:
    """What the workers' lines in `text` say: the latest precision and data path, and the slowest of the
    last `workers` warm-ups (the current workers warm up side by side)."""
    precision, paths = statements(text, PRECISION_NOTE), statements(text, DATA_PATH_NOTE)
    warmups = [Warmup.model_validate_json(report) for report in statements(text, WARMUP_NOTE)][-workers:] if (
        workers > 0) else []  # fmt: skip
    return RuntimeNotes(
        precision_note=precision[-1] if precision else None,
        data_path=DataPathRun.model_validate_json(paths[-1]) if paths else None,
        warmup=max(warmups, key=lambda report: report.seconds) if warmups else None,
    )
