"""Where the load Job puts its results: the experiment's results ConfigMap, through the API.

The Job runs as a per-experiment ServiceAccount that may patch only that ConfigMap and create
ConfigMaps (for the parts of a large document). This uses the pod's in-cluster credentials (token,
CA, KUBERNETES_SERVICE_HOST/PORT) with the standard library only, because the load-generating
process is gevent-patched and needs no async client. `SERVINGLAB_SERVICEACCOUNT_DIR` replaces the
mounted credentials folder (tests use it to run the Job's command as its ServiceAccount outside a pod).

Any size is safe: a document up to :data:`INLINE_LIMIT` is stored as plain `results.json`; a larger
one is gzipped and, past one ConfigMap's worth, split into parts: the first in the results ConfigMap,
the rest in `<results>-part-<i>` ConfigMaps owned by the experiment. :func:`encode_results` and
:func:`decode_results` are the pure halves; :func:`write_results` retries refused or failed writes
with backoff until its deadline, so an API server that is restarting or refusing for a while loses
nothing.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RESULTS_KEY = "results.json"
GZIP_KEY = "results.json.gz"
#: What fits in one ConfigMap with room to spare (the API limit is 1 MiB for data + binaryData).
INLINE_LIMIT = 900 * 1024
#: A gzip part is base64-encoded in binaryData (4/3 larger) and must stay within INLINE_LIMIT.
PART_BYTES = INLINE_LIMIT * 3 // 4
#: At most this many ConfigMaps per document (the load Job's Role names the parts it may patch).
MAX_PARTS = 32
#: The JSON ownerReference of the experiment (the operator sets it in the Job's env): parts are owned by it.
OWNER_ENV = "SERVINGLAB_RESULTS_OWNER"


class SinkError(RuntimeError):
    """Writing the results failed; the message carries the API's answer."""


class ResultsUnreadable(ValueError):
    """The stored results are missing, incomplete or corrupt."""


def part_name(configmap: str, index: int) -> str:
    return f"{configmap}-part-{index}"


def encode_results(configmap: str, document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(ConfigMap name, its data/binaryData) for each ConfigMap the document needs (pure).

    The results ConfigMap comes last, so that it names its parts only once they are all written."""
    text = json.dumps(document, separators=(",", ":"))
    if len(text.encode()) <= INLINE_LIMIT:
        return [(configmap, {"data": {RESULTS_KEY: text}})]
    packed = gzip.compress(text.encode(), compresslevel=6, mtime=0)
    chunks = [packed[i : i + PART_BYTES] for i in range(0, len(packed), PART_BYTES)]
    if len(chunks) > MAX_PARTS:
        raise SinkError(
            f"the results are {len(packed) / 2**20:.1f} MiB gzipped; at most {MAX_PARTS * PART_BYTES / 2**20:.0f} "
            "MiB fit in the experiment's ConfigMaps"
        )
    writes = [
        (part_name(configmap, index), {"binaryData": {GZIP_KEY: base64.b64encode(chunk).decode()}})
        for index, chunk in enumerate(chunks[1:], start=1)
    ]
    head = {
        "data": {"parts": str(len(chunks)), "sha256": hashlib.sha256(packed).hexdigest(), RESULTS_KEY: None},
        "binaryData": {GZIP_KEY: base64.b64encode(chunks[0]).decode()},
    }
    return [*writes, (configmap, head)]


def decode_results(head: dict[str, Any] | None, read_part: Callable[[str], dict[str, Any] | None]) -> dict[str, Any]:
    """The document stored by :func:`encode_results`; `head` is the results ConfigMap, `read_part`
    fetches a part ConfigMap by name. Raises ResultsUnreadable naming what is missing or corrupt."""
    if head is None:
        raise ResultsUnreadable("the results ConfigMap does not exist")
    name = head["metadata"]["name"]
    data, binary = head.get("data") or {}, head.get("binaryData") or {}
    try:
        if data.get(RESULTS_KEY):
            document = json.loads(data[RESULTS_KEY])
        elif GZIP_KEY in binary:
            chunks = [base64.b64decode(binary[GZIP_KEY])]
            for index in range(1, int(data.get("parts", "1"))):
                part = read_part(part_name(name, index))
                if part is None or GZIP_KEY not in (part.get("binaryData") or {}):
                    raise ResultsUnreadable(f"part {index} ({part_name(name, index)}) is missing")
                chunks.append(base64.b64decode(part["binaryData"][GZIP_KEY]))
            packed = b"".join(chunks)
            if data.get("sha256") and hashlib.sha256(packed).hexdigest() != data["sha256"]:
                raise ResultsUnreadable(f"the parts of {name} do not match its sha256")
            document = json.loads(gzip.decompress(packed))
        else:
            raise ResultsUnreadable(f"{name} holds no results yet")
    except (ValueError, OSError, EOFError) as exc:
        if isinstance(exc, ResultsUnreadable):
            raise
        raise ResultsUnreadable(f"{name}: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("results"), list):
        raise ResultsUnreadable(f"{name}: not a results document")
    return document


def _credentials_dir() -> Path:
    return Path(os.environ.get("SERVINGLAB_SERVICEACCOUNT_DIR", SERVICEACCOUNT_DIR))


class _Api:
    """The few calls the sink makes, as this pod's ServiceAccount."""

    def __init__(self, namespace: str | None) -> None:
        credentials = _credentials_dir()
        try:
            self.token = (credentials / "token").read_text().strip()
            self.namespace = (
                namespace or os.environ.get("POD_NAMESPACE") or (credentials / "namespace").read_text().strip()
            )
            host = os.environ["KUBERNETES_SERVICE_HOST"]
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        except (OSError, KeyError) as exc:
            raise SinkError(f"no in-cluster credentials to write results with: {exc}") from None
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        self.base = f"https://{host}:{port}/api/v1/namespaces/{self.namespace}/configmaps"
        self.context = ssl.create_default_context(cafile=str(credentials / "ca.crt"))

    def call(self, method: str, url: str, body: dict[str, Any], content_type: str) -> tuple[int, str]:
        """The HTTP status (2xx on success) and, on an error, the start of the API's answer; raises
        OSError when the server was not reached."""
        request = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            method=method,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=30) as response:
                return int(response.status), ""
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")[:300]

    def put_configmap(self, name: str, content: dict[str, Any], create_missing: bool) -> tuple[int, str]:
        """Merge `content` into ConfigMap `name`; with `create_missing`, create it (owned by the
        experiment) when it does not exist yet."""
        status, detail = self.call("PATCH", f"{self.base}/{name}", content, "application/merge-patch+json")
        if status == 404 and create_missing:
            metadata: dict[str, Any] = {"name": name}
            if owner := os.environ.get(OWNER_ENV):
                metadata["ownerReferences"] = [json.loads(owner)]
            status, detail = self.call("POST", self.base, {"metadata": metadata, **content}, "application/json")
        return status, detail


def write_results(
    configmap: str,
    document: dict[str, Any],
    namespace: str | None = None,
    deadline_seconds: float | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> None:
    """Store `document` in the ConfigMap `configmap` of this pod's namespace (and its parts), retrying
    transient failures — a refused write, an unreachable API server — with backoff until the deadline
    (SERVINGLAB_RESULTS_WRITE_SECONDS, 600 s). A results ConfigMap that no longer exists (the
    experiment was deleted) ends it at once."""
    deadline = time.monotonic() + (deadline_seconds or float(os.environ.get("SERVINGLAB_RESULTS_WRITE_SECONDS", "600")))
    api = _Api(namespace)
    if owner := os.environ.get(OWNER_ENV):  # ties the results to this incarnation of the experiment
        document = {**document, "experimentUid": json.loads(owner)["uid"]}
    for name, content in encode_results(configmap, document):
        delay = 1.0
        while True:
            try:
                # the results ConfigMap is the operator's; only the parts are the Job's to create
                status, detail = api.put_configmap(name, content, create_missing=name != configmap)
                problem = f"HTTP {status}: {detail}"
            except OSError as exc:
                status, problem = 0, str(exc)
            if 200 <= status < 300:
                break
            where = f"write of configmap {api.namespace}/{name}"
            if status == 404 and name == configmap:
                raise SinkError(f"{where}: HTTP 404, the experiment's results ConfigMap is gone")
            if time.monotonic() + delay > deadline:
                raise SinkError(f"{where} kept failing until the deadline: {problem}")
            log(f"{where} failed ({problem}); retrying in {delay:g} s")
            time.sleep(delay)
            delay = min(delay * 2, 15.0)
