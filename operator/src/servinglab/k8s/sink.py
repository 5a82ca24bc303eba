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

The operator reads these ConfigMaps (:class:`Reader`), and anything with the load Job's credentials
can write them: reading is bounded whatever they hold — at most MAX_PARTS parts, each no larger than
a written one, inflated through a cap, and parsed only below a count of JSON values, once, straight into
the typed document (:class:`StoredResults`: the load Job's results, with the bounds of what the operator
copies into status). The writer refuses a document the reader would (MAX_DOCUMENT_BYTES); the spec keeps
every legal one far below it.
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
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator

from servinglab.api.meta import brief_error
from servinglab.api.results import JsonObject, LevelResult, LoadJobResults

SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RESULTS_KEY = "results.json"
GZIP_KEY = "results.json.gz"
#: What fits in one ConfigMap with room to spare (the API limit is 1 MiB for data + binaryData).
INLINE_LIMIT = 900 * 1024
#: A gzip part is base64-encoded in binaryData (4/3 larger) and must stay within INLINE_LIMIT.
PART_BYTES = INLINE_LIMIT * 3 // 4
#: At most this many ConfigMaps per document (the load Job's Role names the parts it may patch).
MAX_PARTS = 32
#: Most bytes of JSON a document may be (written) and inflate to (read). The largest a legal spec makes
#: is about 3.5 MB (servinglab.api.load.MAX_WINDOWS; tests/unit/k8s/test_sink.py builds it).
MAX_DOCUMENT_BYTES = 8 << 20
#: Most values a document may hold, counted as its objects, arrays and commas: parsed, a value costs
#: 30-200 bytes, far more than its text (`{},` is 3 bytes), so this, not the byte cap, bounds what a
#: hostile document costs to parse (under 100 MiB, measured). The largest legal one holds about 270,000.
MAX_VALUES = 600_000
#: Most levels one document may hold (64 concurrency levels; 64 rates and 32 peak-search probes).
MAX_LEVELS = 128
#: The ceiling figures are copied into the experiment's status: a few hundred bytes, never more than this.
MAX_CEILING_BYTES = 16 * 1024
#: The JSON ownerReference of the experiment (the operator sets it in the Job's env): parts are owned by it.
OWNER_ENV = "SERVINGLAB_RESULTS_OWNER"


class SinkError(RuntimeError):
    """Writing the results failed; the message carries the API's answer."""


class ResultsUnreadable(ValueError):
    """The stored results are corrupt, malformed or too large to read; the message names what."""


class ResultsMissing(ResultsUnreadable):
    """The stored results are not there (yet), or a part of them is missing."""


def part_name(configmap: str, index: int) -> str:
    return f"{configmap}-part-{index}"


def encode_results(configmap: str, document: JsonObject) -> list[tuple[str, JsonObject]]:
    """(ConfigMap name, its data/binaryData) for each ConfigMap the document needs (pure).

    The results ConfigMap comes last, so that it names its parts only once they are all written."""
    text = json.dumps(document, separators=(",", ":"))
    if len(text.encode()) > MAX_DOCUMENT_BYTES:
        raise SinkError(
            f"the results are {len(text.encode()) / 2**20:.1f} MiB of JSON; the operator reads at most "
            f"{MAX_DOCUMENT_BYTES >> 20} MiB (fewer or longer stability windows make them smaller)"
        )
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


class StoredResults(LoadJobResults):
    """A results document as the operator reads it: the load Job's results, at most MAX_LEVELS levels and a
    ceiling of at most MAX_CEILING_BYTES (what it copies into the experiment's status stays small)."""

    results: Annotated[list[LevelResult], Field(max_length=MAX_LEVELS)]

    @field_validator("ceiling", mode="before")
    @classmethod
    def _small(cls, ceiling: Any) -> Any:
        if ceiling is not None and len(json.dumps(ceiling)) > MAX_CEILING_BYTES:
            raise ValueError(f"more than {MAX_CEILING_BYTES} bytes; the ceiling's figures are a few hundred")
        return ceiling


class Reader:
    """Reads one stored document within bounds, part by part (the operator awaits each part between
    calls): at most MAX_PARTS parts, each no larger than a written one, inflated through a cap of
    MAX_DOCUMENT_BYTES, parsed only if it holds at most MAX_VALUES values, and validated once, strictly
    (JSON's own types), as :class:`StoredResults`. Whatever a writer put there, reading it costs the
    reader a bounded amount of memory; anything beyond raises ResultsUnreadable naming what was too large
    or malformed."""

    def __init__(self, head: JsonObject | None) -> None:
        if head is None:
            raise ResultsMissing("the results ConfigMap does not exist")
        self.name = str(head["metadata"]["name"])
        data, binary = head.get("data") or {}, head.get("binaryData") or {}
        self._plain: str | None = data.get(RESULTS_KEY) or None
        self._digest = hashlib.sha256()
        self._expected_digest = data.get("sha256")
        self._inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip only
        self._inflated = bytearray()
        self.part_names: list[str] = []
        if self._plain is not None:
            if len(self._plain) > INLINE_LIMIT:
                size = len(self._plain)
                raise ResultsUnreadable(f"{self.name}: {RESULTS_KEY} is {size} bytes; at most {INLINE_LIMIT}")
            return
        if GZIP_KEY not in binary:
            raise ResultsMissing(f"{self.name} holds no results yet")
        claimed = str(data.get("parts", "1"))
        if not claimed.isdigit() or not 1 <= int(claimed) <= MAX_PARTS:
            raise ResultsUnreadable(f"{self.name} claims {claimed[:20]!r} parts; a document has 1 to {MAX_PARTS}")
        self.part_names = [part_name(self.name, index) for index in range(1, int(claimed))]
        self._feed(binary[GZIP_KEY], self.name)

    def add_part(self, index: int, part: JsonObject | None) -> None:
        """Part `index` (1-based, in order) as read, None if it does not exist."""
        name = part_name(self.name, index)
        if part is None or GZIP_KEY not in (part.get("binaryData") or {}):
            raise ResultsMissing(f"part {index} ({name}) is missing")
        self._feed(part["binaryData"][GZIP_KEY], name)

    def _feed(self, encoded: Any, where: str) -> None:
        if not isinstance(encoded, str) or len(encoded) > INLINE_LIMIT:
            size = len(encoded) if isinstance(encoded, str) else type(encoded).__name__
            raise ResultsUnreadable(f"{where}: {GZIP_KEY} is {size} bytes; a part holds at most {INLINE_LIMIT}")
        try:
            packed = base64.b64decode(encoded, validate=True)
        except ValueError:
            raise ResultsUnreadable(f"{where}: {GZIP_KEY} is not base64") from None
        self._digest.update(packed)
        try:
            while packed:
                # max_length caps what one call may inflate; 0 would mean no cap, and it is never 0 here
                room = MAX_DOCUMENT_BYTES + 1 - len(self._inflated)
                self._inflated += self._inflater.decompress(packed, room)
                if len(self._inflated) > MAX_DOCUMENT_BYTES:
                    raise ResultsUnreadable(
                        f"{self.name}: the results inflate to more than {MAX_DOCUMENT_BYTES >> 20} MiB of JSON "
                        f"(read up to {where}); the operator reads at most that"
                    )
                packed = self._inflater.unconsumed_tail
        except zlib.error as exc:
            raise ResultsUnreadable(f"{where}: not gzip data ({exc})") from None

    def results(self) -> StoredResults:
        """The whole document, once every part in `part_names` has been added."""
        if self._plain is not None:
            text = self._plain.encode()
        else:
            if self._expected_digest and self._digest.hexdigest() != self._expected_digest:
                raise ResultsUnreadable(f"the parts of {self.name} do not match its sha256")
            if not self._inflater.eof or self._inflater.unused_data:
                raise ResultsUnreadable(f"{self.name}: the gzip stream is truncated or followed by other bytes")
            text = bytes(self._inflated)
        values = text.count(b"{") + text.count(b"[") + text.count(b",")  # commas in strings count too: a bound
        if values > MAX_VALUES:
            raise ResultsUnreadable(f"{self.name}: the results hold up to {values} JSON values; at most {MAX_VALUES}")
        try:
            return StoredResults.model_validate_json(text, strict=True)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            if errors[0]["type"] == "json_invalid":
                raise ResultsUnreadable(f"{self.name}: not JSON ({errors[0]['msg'][:200]})") from None
            problems = [brief_error(error) for error in errors[:5]]
            more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
            raise ResultsUnreadable(f"{self.name}: not a results document: {'; '.join(problems)}{more}") from None


def decode_results(head: JsonObject | None, read_part: Callable[[str], JsonObject | None]) -> StoredResults:
    """The document stored by :func:`encode_results`; `head` is the results ConfigMap, `read_part`
    fetches a part ConfigMap by name. Raises ResultsUnreadable naming what is missing, corrupt or
    too large (see :class:`Reader`)."""
    reader = Reader(head)
    for index, name in enumerate(reader.part_names, start=1):
        reader.add_part(index, read_part(name))
    return reader.results()


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

    def call(self, method: str, url: str, body: JsonObject, content_type: str) -> tuple[int, str]:
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

    def put_configmap(self, name: str, content: JsonObject, create_missing: bool) -> tuple[int, str]:
        """Merge `content` into ConfigMap `name`; with `create_missing`, create it (owned by the
        experiment) when it does not exist yet."""
        status, detail = self.call("PATCH", f"{self.base}/{name}", content, "application/merge-patch+json")
        if status == 404 and create_missing:
            metadata: JsonObject = {"name": name}
            if owner := os.environ.get(OWNER_ENV):
                metadata["ownerReferences"] = [json.loads(owner)]
            status, detail = self.call("POST", self.base, {"metadata": metadata, **content}, "application/json")
        return status, detail


#: How long the load Job keeps retrying its results write by default (SERVINGLAB_RESULTS_WRITE_SECONDS): the
#: load Job's deadline leaves it this long after the load (:mod:`servinglab.k8s.deadline`).
WRITE_SECONDS = 600.0


def write_results(
    configmap: str,
    document: JsonObject,
    namespace: str | None = None,
    deadline_seconds: float | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> None:
    """Store `document` in the ConfigMap `configmap` of this pod's namespace (and its parts), retrying
    transient failures — a refused write, an unreachable API server — with backoff until the deadline
    (SERVINGLAB_RESULTS_WRITE_SECONDS, 600 s). A results ConfigMap that no longer exists (the
    experiment was deleted) ends it at once."""
    window = deadline_seconds or float(os.environ.get("SERVINGLAB_RESULTS_WRITE_SECONDS", WRITE_SECONDS))
    deadline = time.monotonic() + window
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
