"""Request bodies: generated (seeded images encoded as JPEG/PNG, or raw uint8 tensors in .npy format)
or the user's own (files, or a JSON-lines file of records), each with its content type.

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


class PayloadError(ValueError):
    """The user's bodies cannot be read; the message names the file or record."""


@dataclass(frozen=True)
class Payload:
    """One request body and the Content-Type it is sent with."""

    body: bytes
    content_type: str


def _read(path: Path, what: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_BODY_BYTES:
            raise PayloadError(f"{what}: {path} is {size} bytes; one body may be at most {MAX_BODY_BYTES}")
        return path.read_bytes()
    except OSError as exc:
        raise PayloadError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None


def _record(line: str, number: int, source: Path, root: Path) -> Payload:
    where = f"load.payload.records: {source}, line {number}"
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise PayloadError(f"{where}: not JSON ({exc})") from None
    if not isinstance(record, dict) or ("body" in record) == ("bodyFile" in record):
        raise PayloadError(f'{where}: a record is {{"body": ..., "contentType": ...}} or {{"bodyFile": ...}}')
    content_type = record.get("contentType")
    if "bodyFile" in record:
        path = root / str(record["bodyFile"])
        body = _read(path, where)
        content_type = content_type or FILE_CONTENT_TYPES.get(path.suffix.lower(), "application/octet-stream")
    elif isinstance(record["body"], str):
        body, content_type = record["body"].encode(), content_type or "text/plain"
    else:  # any other JSON value is sent as JSON
        body, content_type = json.dumps(record["body"]).encode(), content_type or "application/json"
    return Payload(body, str(content_type))


def own_payloads(spec: PayloadSpec, root: Path) -> list[Payload]:
    """The user's bodies (`files` or `records`, paths relative to `root`), in an order shuffled by `seed`."""
    if spec.records is not None:
        source = root / spec.records
        text = _read(source, "load.payload.records").decode("utf-8", errors="replace")
        bodies = [_record(line, n, source, source.parent)
                  for n, line in enumerate(text.splitlines(), start=1) if line.strip()]  # fmt: skip
        if not bodies:
            raise PayloadError(f"load.payload.records: {source} holds no records")
    else:
        bodies = [
            Payload(_read(root / name, "load.payload.files"),
                    FILE_CONTENT_TYPES.get(Path(name).suffix.lower(), "application/octet-stream"))
            for name in spec.files
        ]  # fmt: skip
    random.Random(spec.seed).shuffle(bodies)
    return bodies


def request_payloads(spec: PayloadSpec, image_size: int, root: Path) -> list[Payload]:
    """What the load sends: the user's own bodies if given, else generated images of `image_size`."""
    if spec.own_bodies:
        return own_payloads(spec, root)
    content_type = CONTENT_TYPES[spec.format]
    return [Payload(body, content_type) for body in make_payloads(spec.format, image_size, spec.variants, spec.seed)]
