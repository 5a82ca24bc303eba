"""A load Job that writes chosen results instead of measuring (the stand-in kubelet's `job_command`).

Run as the load container would be — the experiment's ServiceAccount, its results ConfigMap and
ownerReference from the pod's environment — it gives the operator results no real load run of a
short test could: `large` writes a several-MiB document through the real sink (`write_results`, with
its retries); `many-parts` writes a head claiming a million parts; `bomb` writes parts whose gzip
inflates to 200 MiB, with a matching sha256, as a compromised load pod could; `small` writes one level at
once, as a shaped run's summary (a test of the Job's life, not of its load).

    python results_writer.py small|large|many-parts|bomb
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import sys
import time
import zlib
from typing import Any

from servinglab.k8s import sink as results_sink

#: Windows per level of the `large` document: 2 levels of them are over 3 MB of JSON.
LARGE_WINDOWS = 25_000


def large_document() -> dict[str, Any]:
    """Two levels, each with tens of thousands of stability windows, in the load Job's own shape."""
    rng = random.Random(7)
    levels = []
    for users in (1, 2):
        windows = [
            {"start": round(1.7e9 + i * 0.05, 3), "throughputRps": round(rng.uniform(0, 900), 3),
             "p99Ms": round(rng.uniform(1, 80), 3)}
            for i in range(LARGE_WINDOWS)
        ]  # fmt: skip
        levels.append({
            "concurrency": users, "throughputRps": 100.0 * users, "requests": 1000 * users, "errors": 0,
            "errorsByKind": {}, "windowSeconds": LARGE_WINDOWS * 0.05, "windowStart": 1.7e9,
            "windowEnd": 1.7e9 + LARGE_WINDOWS * 0.05,
            "latencyMs": {"p50": 5.0, "p90": 8.0, "p95": 9.0, "p99": 12.0, "max": 20.0},
            "stability": {"windows": windows, "stable": True}, "generator": {"saturated": False},
        })  # fmt: skip
    return {"results": levels}


def small_document() -> dict[str, Any]:
    """One level of an open-loop run, measured just now."""
    now = time.time()
    return {"results": [{
        "rateRps": 10.0, "throughputRps": 10.0, "requests": 100, "errors": 0, "errorsByKind": {},
        "windowSeconds": 10.0, "windowStart": now - 10, "windowEnd": now,
        "latencyMs": {"p50": 5.0, "p90": 8.0, "p95": 9.0, "p99": 12.0, "max": 20.0},
        "generator": {"saturated": False},
    }]}  # fmt: skip


def packed_zeros(mebibytes: int) -> bytes:
    packer = zlib.compressobj(9, wbits=16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(mebibytes)) + packer.flush()


def write_head_and_parts(api: Any, configmap: str, chunks: list[bytes], parts: str, digest: str) -> None:
    encoded = [base64.b64encode(chunk).decode() for chunk in chunks]
    for index, part in enumerate(encoded[1:], start=1):
        status, detail = api.put_configmap(
            results_sink.part_name(configmap, index), {"binaryData": {results_sink.GZIP_KEY: part}}, True
        )
        assert 200 <= status < 300, (status, detail)
    head = {
        "data": {"parts": parts, "sha256": digest, results_sink.RESULTS_KEY: None},
        "binaryData": {results_sink.GZIP_KEY: encoded[0]},
    }
    status, detail = api.put_configmap(configmap, head, False)
    assert 200 <= status < 300, (status, detail)


def main(mode: str) -> None:
    owner = json.loads(os.environ[results_sink.OWNER_ENV])
    configmap = f"{owner['name']}-results"
    if mode in ("small", "large"):
        results_sink.write_results(configmap, small_document() if mode == "small" else large_document())
        return
    api = results_sink._Api(None)  # the sink's own client, as this pod's ServiceAccount
    if mode == "many-parts":
        small = zlib.compressobj(6, wbits=16 + zlib.MAX_WBITS)  # a valid first part: a document by itself
        chunk = small.compress(json.dumps({"results": []}).encode()) + small.flush()
        write_head_and_parts(api, configmap, [chunk], "1000000", hashlib.sha256(chunk).hexdigest())
    elif mode == "bomb":
        packed = packed_zeros(200)
        half = len(packed) // 2
        write_head_and_parts(api, configmap, [packed[:half], packed[half:]], "2", hashlib.sha256(packed).hexdigest())
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(f"wrote {mode} results to {configmap}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
