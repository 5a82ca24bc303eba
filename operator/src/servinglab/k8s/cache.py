"""Watch-fed caches: one list, then one long watch per collection, instead of a list per reconcile pass.

An :class:`Informer` keeps, for one collection (all namespaces or one; label- or field-selected), a
digest of each object — what its readers need, made by a pure function that returns None for objects
not worth keeping — and calls back when a digest changed. It lists page by page, watches from the
list's resourceVersion, resumes a watch that ended, lists again when the version is too old (410), and
backs off on errors (keeping the last error for whoever waits on it). Any other exception (a bug in a
digest, an answer the client does not map) would end the watch and freeze the cache's view without a
word: it is logged with its traceback, counted (`servinglab_watch_restarts_total`), kept as the error,
the cache marked unsynced until it has listed again, and the watch started afresh after a back-off.
An object the operator writes
itself may be :meth:`offered <Informer.offer>` at once (:meth:`servinglab.k8s.client.Kube.observe`):
of two versions of an object, the newer resourceVersion wins, so a pass reads its own writes and a
late watch event never takes them back. Used by the GPU queue (:mod:`.experiment.admission`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from servinglab.k8s.client import Gone, Kube, KubeError, Ref
from servinglab.k8s.metrics import WATCH_RESTARTS
from servinglab.servers.base import Manifest

LOG = logging.getLogger("servinglab.cache")
T = TypeVar("T")

#: A watch the API server ends after this many seconds is resumed from where it was.
WATCH_SECONDS = 240
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
#: A watch that has run this long since its last restart starts its back-off from the beginning again.
HEALTHY_SECONDS = 60.0


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _version(obj: Mapping[str, Any]) -> int | None:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None


def newer(incoming: Mapping[str, Any], stored: int | None) -> bool:
    """Whether `incoming` may replace what is stored at version `stored`. resourceVersions are opaque to
    clients in general; every API server in use writes etcd's revision there, so they are compared as
    numbers when both are, and otherwise the incoming object wins."""
    version = _version(incoming)
    return stored is None or version is None or version >= stored


class Informer(Generic[T]):
    """One collection, as digests by `namespace/name`; :attr:`synced` is set once the first list is in."""

    def __init__(
        self,
        kube: Kube,
        ref: Ref,
        digest: Callable[[Manifest], T | None],
        *,
        label_selector: str = "",
        field_selector: str = "",
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.kube, self.ref, self.digest = kube, ref, digest
        self.label_selector, self.field_selector = label_selector, field_selector
        self.on_change = on_change
        self._items: dict[str, tuple[T, int | None]] = {}
        # keys written by the operator at a version the watch has not reached yet: older events are stale
        self._ahead: dict[str, int] = {}
        self.synced = asyncio.Event()
        self.error: str | None = None
        self.events = 0
        self.restarts = 0

    def values(self) -> list[T]:
        return [digest for digest, _ in self._items.values()]

    def get(self, namespace: str, name: str) -> T | None:
        found = self._items.get(f"{namespace}/{name}")
        return found[0] if found is not None else None

    def offer(self, obj: Manifest) -> None:
        """An object read or written outside the watch: kept unless older than what is here."""
        key, version = _key(obj), _version(obj)
        if not newer(obj, self._ahead.get(key)):
            return
        stored = self._items.get(key)
        if stored is not None and not newer(obj, stored[1]):
            return
        if version is not None:
            self._ahead[key] = version
        self._put(key, obj)

    def event(self, kind: str, obj: Manifest) -> None:
        """One watch event (ADDED, MODIFIED, DELETED, BOOKMARK), in the watch's order."""
        key, version = _key(obj), _version(obj)
        if key in self._ahead and not newer(obj, self._ahead[key]):
            return  # the operator has written a later version of this object already
        if kind == "DELETED":
            self._drop(key)
        elif kind in ("ADDED", "MODIFIED"):
            self._put(key, obj)
        if version is not None:  # the watch has delivered every change of this collection up to here
            self._ahead = {k: v for k, v in self._ahead.items() if v > version}

    def _put(self, key: str, obj: Manifest) -> None:
        stored = self._items.get(key)
        digest = self.digest(obj)
        if digest is None:
            self._drop(key)
            return
        self._items[key] = (digest, _version(obj))
        if stored is None or stored[0] != digest:
            self.on_change()

    def _drop(self, key: str) -> None:
        if self._items.pop(key, None) is not None:
            self.on_change()

    def replace(self, objects: list[Manifest], version: str) -> None:
        """A fresh list: what it lacks is gone, unless the operator wrote it after the list was taken."""
        kept = {_key(obj): obj for obj in objects}
        for key in set(self._items) - set(kept) - set(self._ahead):
            self._drop(key)
        for key, obj in kept.items():
            if key not in self._ahead or newer(obj, self._ahead[key]):
                self._put(key, obj)
        listed = int(version) if version.isdigit() else None
        self._ahead = {k: v for k, v in self._ahead.items() if listed is not None and v > listed}

    async def run(self) -> None:
        """Keep the cache current until cancelled; a watch that fails in a way :meth:`_follow` does not
        expect is started again, listing afresh, and says so."""
        crashes, since = 0, time.monotonic()
        while True:
            try:
                await self._follow()
            except Exception as exc:  # anything else would silently freeze this cache
                now = time.monotonic()
                crashes = crashes + 1 if now - since < HEALTHY_SECONDS else 1
                since = now
                self.restarts += 1
                self.error = f"the watch of {self.what} failed ({type(exc).__name__}: {exc}); restarted"
                self.synced.clear()  # until it has listed again: its readers wait rather than trust it
                WATCH_RESTARTS.labels(kind=self.ref.kind).inc()
                delay = BACKOFF_SECONDS[min(crashes - 1, len(BACKOFF_SECONDS) - 1)]
                LOG.error("the watch of %s failed; it lists again in %g s", self.what, delay, exc_info=exc)
                await asyncio.sleep(delay)

    @property
    def what(self) -> str:
        return f"{self.ref.kind}s in {self.ref.namespace or 'all namespaces'}"

    async def _follow(self) -> None:
        """List, then watch from there, for as long as the errors are the API's (expected)."""
        failures = 0
        version = ""
        while True:
            try:
                if not version:
                    objects, version = await self.kube.list_all(self.ref, self.label_selector, self.field_selector)
                    self.replace(objects, version)
                    self.synced.set()
                async for kind, obj in self.kube.watch(
                    self.ref, version, self.label_selector, self.field_selector, WATCH_SECONDS
                ):
                    self.events += 1
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    self.event(kind, obj)
                failures, self.error = 0, None
            except Gone:
                version = ""  # too old: list again
            except KubeError as exc:
                self.error = str(exc)
                delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]
                failures += 1
                LOG.warning("%s; again in %g s", exc, delay)
                await asyncio.sleep(delay)
                if failures > 2:
                    version = ""  # a watch that keeps failing may have missed changes: list again
