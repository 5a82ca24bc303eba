"""Generated request bodies: seeded images encoded as JPEG/PNG, or raw uint8 tensors in .npy format.

Used by the load generator (local and in the Kubernetes Job) and by tests; no torch needed.
"""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt
from PIL import Image

from servinglab.spec import PayloadFormat

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
