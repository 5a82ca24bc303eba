"""Request bodies: generated (seeded images encoded as JPEG/PNG, or raw uint8 tensors in .npy format)
or the user's own (files, or a JSON-lines file of records), each with its content type. The user's
files are read only from the payload folder (:mod:`servinglab.loadgen.folder`), and only so many and
so large: a spec cannot make the load read a file elsewhere or hold unbounded bodies.

Used by the load generator (local and in the Kubernetes Job) and by tests; no torch needed.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image

from servinglab.api import PayloadFormat, PayloadSpec
from servinglab.loadgen import folder

CONTENT_TYPES = {
    PayloadFormat.JPEG: "image/jpeg",
    PayloadFormat.PNG: "image/png",
    PayloadFormat.RAW: "application/x-npy",
}


def _image(rng: np.random.Generator, size: int) -> npt.NDArray[np.uint8]:
    """A smooth gradient plus noise: compresses like a photo rather than like pure noise."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / max(size - 1, 1)
    phases = rng.uniform(0, 2 * np.pi, size=3)
    base = np.stack([0.5 + 0.5 * np.sin(2 * np.pi * (x + y) + p) for p in phases], axis=-1)
    noisy = base * 200 + rng.normal(0, 12, size=(size, size, 3))
    image: npt.NDArray[np.uint8] = np.clip(noisy, 0, 255).astype(np.uint8)
    return image


def encode(array: npt.NDArray[np.uint8], fmt: PayloadFormat) -> bytes:
    buffer = io.BytesIO()
    if fmt is PayloadFormat.RAW:
        np.save(buffer, array, allow_pickle=False)
    elif fmt is PayloadFormat.PNG:
        Image.fromarray(array).save(buffer, format="PNG")
    else:
        Image.fromarray(array).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def make_payloads(fmt: PayloadFormat, size: int, variants: int, seed: int) -> list[bytes]:
    """`variants` distinct bodies of a `size`x`size` RGB image, deterministic for a seed."""
    rng = np.random.default_rng(seed)
    return [encode(_image(rng, size), fmt) for _ in range(variants)]


#: Content types of the user's body files, by extension; anything else is sent as octet-stream.
FILE_CONTENT_TYPES = {
    ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".npy": "application/x-npy",
    ".json": "application/json", ".txt": "text/plain", ".csv": "text/csv",
}  # fmt: skip
#: Largest single body read into memory (a request, not a dataset).
MAX_BODY_BYTES = 64 << 20
#: Most bodies, and most bytes of them in all (records file included): every generator holds them all.
MAX_BODIES = 100_000
MAX_TOTAL_BYTES = 256 << 20


class PayloadError(ValueError):
    """The user's bodies cannot be read; the message names the file or record."""


@dataclass(frozen=True)
class Payload:
    """One request body and the Content-Type it is sent with."""

    body: bytes
    content_type: str


def _read(root: Path, name: str, what: str, limit: int = MAX_BODY_BYTES, start: Path | None = None) -> bytes:
    """The file `name` of the payload folder `root` (see :mod:`servinglab.loadgen.folder`)."""
    try:
        return folder.read_bounded(folder.confined(root, name, what, start), limit, what, repr(name))
    except folder.FolderError as exc:
        raise PayloadError(str(exc)) from None


def _record(line: str, where: str, root: Path, records_dir: Path) -> Payload:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"{where}: not JSON ({str(exc)[:100]})") from None
    if not isinstance(record, dict) or ("body" in record) == ("bodyFile" in record):
        raise PayloadError(f'{where}: a record is {{"body": ..., "contentType": ...}} or {{"bodyFile": ...}}')
    content_type = record.get("contentType")
    if "bodyFile" in record:
        name = str(record["bodyFile"])
        body = _read(root, name, f"{where}: bodyFile", start=records_dir)  # relative to the records file
        content_type = content_type or FILE_CONTENT_TYPES.get(Path(name).suffix.lower(), "application/octet-stream")
    elif isinstance(record["body"], str):
        body, content_type = record["body"].encode(), content_type or "text/plain"
    else:  # any other JSON value is sent as JSON
        body, content_type = json.dumps(record["body"]).encode(), content_type or "application/json"
    return Payload(body, str(content_type))


def own_payloads(spec: PayloadSpec, root: Path) -> list[Payload]:
    """The user's bodies (`files` or `records`, paths relative to the payload folder `root` and confined
    to it), in an order shuffled by `seed`; at most MAX_BODIES of them, MAX_TOTAL_BYTES in all."""
    bodies: list[Payload] = []
    total = 0

    def add(payload: Payload, where: str) -> None:
        nonlocal total
        total += len(payload.body)
        if total > MAX_TOTAL_BYTES:
            raise PayloadError(f"{where}: the bodies so far are over {MAX_TOTAL_BYTES >> 20} MiB; at most that in all")
        bodies.append(payload)

    if spec.records is not None:
        what = f"load.payload.records: {spec.records}"
        source = _confined(root, spec.records, "load.payload.records")
        text = _read(root, spec.records, "load.payload.records", MAX_TOTAL_BYTES).decode("utf-8", errors="replace")
        total = len(text)
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            if len(bodies) == MAX_BODIES:
                raise PayloadError(f"{what}, line {number}: more than {MAX_BODIES} records; at most that many")
            where = f"{what}, line {number}"
            add(_record(line, where, root, source.parent), where)
        if not bodies:
            raise PayloadError(f"{what} holds no records")
    else:
        for name in spec.files:  # at most 10,000 (the spec)
            body = _read(root, name, "load.payload.files")
            add(Payload(body, FILE_CONTENT_TYPES.get(Path(name).suffix.lower(), "application/octet-stream")),
                f"load.payload.files: {name!r}")  # fmt: skip
    random.Random(spec.seed).shuffle(bodies)
    return bodies


def _confined(root: Path, name: str, what: str) -> Path:
    try:
        return folder.confined(root, name, what)
    except folder.FolderError as exc:
        raise PayloadError(str(exc)) from None


def request_payloads(spec: PayloadSpec, image_size: int, root: Path) -> list[Payload]:
    """What the load sends: the user's own bodies if given, else generated images of `image_size`."""
    if spec.own_bodies:
        return own_payloads(spec, root)
    content_type = CONTENT_TYPES[spec.format]
    return [Payload(body, content_type) for body in make_payloads(spec.format, image_size, spec.variants, spec.seed)]
