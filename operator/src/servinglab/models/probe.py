"""Parameters and FLOPs of a packed user model (TorchScript or exported program), in a child process.

    python -m servinglab.models.probe_child /path/to/packed-model-folder

Started by :func:`count` for the local runner and by `servinglab count-model` (the server pod's second
init container, which mounts the model store read-only and neither the model cache nor any credentials:
loading a `.pt2` unpickles, so this runs the user's code), so the load-generating process never imports
torch. The model is loaded with the handler's own loader and run once at fp32 on the CPU on one sample of
its declared input, under PyTorch's FLOP counter (matrix products and convolutions: 2 FLOPs per
multiply-add). A count that cannot be made (an operator the counter does not know, a model that fails on
zeros) is reported as null with the reason, never guessed. What the child prints is the user's code's to
forge, so only the three figures are taken from it, typed (:func:`checked`); nothing is kept here (the
caller keeps counts where it trusts them).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

#: A note is a sentence; a longer one is cut here.
_NOTE_MAX_CHARS = 500


COUNTS = ("parameters", "flopsPerInference", "weightBytes", "activationBytes")


class ModelCounts(BaseModel):
    """What the probe's child answers (:mod:`.probe_child`, :mod:`.onnxcount`): a figure is null when it
    could not be counted, and `count_note` says why."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    parameters: int | None
    flops_per_inference: int | None
    weight_bytes: int | None = None
    activation_bytes: int | None = None
    count_note: str | None = None

    def line(self) -> str:
        """The answer as the child prints it: one JSON line, every figure named."""
        return json.dumps(self.model_dump(by_alias=True))


def checked(answer: object) -> dict[str, Any] | None:
    """The counts in `answer` if it is exactly {"parameters", "flopsPerInference", "weightBytes",
    "activationBytes", "countNote"} (or without the bytes) with non-negative integers (or null) and a short
    text (or null); else None."""
    if not isinstance(answer, dict) or set(answer) not in ({*COUNTS, "countNote"}, {*COUNTS[:2], "countNote"}):
        return None  # (an older probe counts no bytes)
    for key in COUNTS:
        value = answer.get(key)
        if value is not None and (type(value) is not int or value < 0):
            return None
    note = answer["countNote"]
    if note is not None and not isinstance(note, str):
        return None
    return {**answer, "countNote": note[:_NOTE_MAX_CHARS] if note else note}


class _Tail:
    """The last `keep` bytes a pipe carried: the child's output is the user's code's, never kept whole."""

    def __init__(self, stream: IO[bytes], keep: int = 1 << 16) -> None:
        self.data, self.keep = bytearray(), keep
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        while chunk := stream.read1(1 << 16):  # type: ignore[attr-defined]
            self.data += chunk
            del self.data[: max(0, len(self.data) - self.keep)]

    def lines(self) -> list[str]:
        self.thread.join(5.0)
        return self.data.decode(errors="replace").strip().splitlines()


def _uncounted(note: str) -> dict[str, Any]:
    return {**dict.fromkeys(COUNTS), "countNote": note}


def count(directory: Path, timeout: float = 300.0) -> dict[str, Any]:
    """{"parameters", "flopsPerInference", "weightBytes", "activationBytes", "countNote"} for a packed model."""
    child = subprocess.Popen([sys.executable, "-m", "servinglab.models.probe_child", str(directory)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert child.stdout is not None and child.stderr is not None
    out, err = _Tail(child.stdout), _Tail(child.stderr)
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return _uncounted(f"not counted within {timeout:g} s")
    lines = [line for line in out.lines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        tail = (err.lines() or ["no output"])[-1]
        note = f"the model did not load: {tail}"[:_NOTE_MAX_CHARS]
        return _uncounted(note)
    try:
        counts = checked(json.loads(lines[-1]))
    except ValueError:
        counts = None
    if counts is None:
        return _uncounted("the model's probe answered nonsense")
    return counts
