"""Leader election on a coordination.k8s.io Lease, so that exactly one operator process acts.

Two operator replicas (a rollout surge, a second install in the same namespace) would both reconcile the
same experiments: two Jobs, two results. The operator's startup handler blocks in :meth:`Election.acquire`
until it holds the Lease, then :meth:`Election.keep` renews it; a stopping process releases the Lease so
that a standby takes over at once. The Lease lives in the operator's own namespace (settings), so every
replica of one install contends for the same Lease whatever namespaces it watches.

Expiry is judged the way client-go does: by how long this process has watched the same record
unchanged, not by comparing another host's renewTime with the local clock, so clock skew between
nodes cannot hand the Lease to two holders. It follows that a standby cannot take over earlier than a
whole lease after our last renewal was *sent*. Three things keep this process from acting past that
point, and none of them waits for an API call to return:

- a validity deadline, two thirds of the lease after the start of the last successful renewal:
  :meth:`Election.leading` checks it locally, and the operator's API client refuses every write once it
  has passed (the fence; :attr:`servinglab.k8s.client.Kube.fence`);
- every renewal attempt is bounded by the time left before that deadline (and by a third of the
  lease), so a hung call cannot outlive it;
- a renewal that fails steps down (`on_lost`: the operator exits): an API error once the deadline has
  passed, another holder or anything unexpected (a malformed answer, a bug) at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from servinglab.k8s.client import Conflict, Kube, KubeError, Ref
from servinglab.servers.base import Manifest

LOG = logging.getLogger("servinglab.leader")
LEASE_NAME = "servinglab-operator"


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_manifest(ref: Ref, identity: str, lease_seconds: float, previous: Manifest | None) -> Manifest:
    """The Lease held by `identity` from now on (pure); keeps resourceVersion for a conditional write."""
    spec = dict((previous or {}).get("spec") or {})
    now = _micro_time()
    taking_over = spec.get("holderIdentity") != identity
    spec |= {
        "holderIdentity": identity,
        "leaseDurationSeconds": max(1, round(lease_seconds)),
        "renewTime": now,
    }
    if taking_over:
        spec["acquireTime"] = now
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if previous else 0)
    metadata: Manifest = {"name": ref.name, "namespace": ref.namespace}
    if previous is not None:
        metadata["resourceVersion"] = previous["metadata"]["resourceVersion"]
    return {"apiVersion": ref.api_version, "kind": ref.kind, "metadata": metadata, "spec": spec}


@dataclass
class Election:
    """One process's candidacy for the Lease `namespace/name`. `kube` serves the Lease calls alone (its own
    connections, never queued behind the reconcilers' calls, and never fenced)."""

    kube: Kube
    namespace: str
    identity: str
    lease_seconds: float = 15.0
    name: str = LEASE_NAME
    _observed: tuple[Any, ...] = field(default=(), init=False)
    _observed_at: float = field(default=0.0, init=False)
    _valid_until: float = field(default=0.0, init=False)

    @property
    def ref(self) -> Ref:
        return Ref("coordination.k8s.io/v1", "Lease", self.namespace, self.name)

    @property
    def renew_deadline(self) -> float:
        """How long one renewal keeps this process leading: two thirds of the lease, which leaves a third
        for a write already on its way and for a late timer before a standby may take over."""
        return self.lease_seconds * 2 / 3

    def leading(self) -> bool:
        """Whether this process may still act: a local clock check, no API call (the write fence)."""
        return time.monotonic() < self._valid_until

    def _expired(self, lease: Manifest) -> bool:
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        return not spec.get("holderIdentity") or now - self._observed_at > duration

    async def try_acquire(self) -> bool:
        """Take or renew the Lease if it is ours, free or expired; False while another holds it."""
        began = time.monotonic()  # a standby's clock for our record cannot start before this
        lease = await self.kube.get(self.ref)
        mine = lease is not None and (lease.get("spec") or {}).get("holderIdentity") == self.identity
        if lease is not None and not mine and not self._expired(lease):
            return False
        manifest = lease_manifest(self.ref, self.identity, self.lease_seconds, lease)
        try:
            await (self.kube.replace(manifest) if lease is not None else self.kube.create(manifest))
        except Conflict:  # another candidate wrote first
            return False
        self._valid_until = began + self.renew_deadline
        return True

    async def _attempt(self, budget: float) -> bool:
        """One try_acquire that gives up after `budget` seconds (TimeoutError), whatever the calls do."""
        async with asyncio.timeout(max(budget, 0.0)):
            return await self.try_acquire()

    async def acquire(self) -> None:
        """Wait until this process holds the Lease."""
        announced = False
        while True:
            try:
                if await self._attempt(self.lease_seconds / 3):
                    LOG.info("leading as %s (lease %s)", self.identity, self.ref)
                    return
            except (KubeError, TimeoutError) as exc:
                LOG.warning("lease %s: %s", self.ref, exc or "no answer in time")
            except Exception as exc:  # a malformed answer: not leading yet, so nothing to step down from
                LOG.warning("lease %s: unreadable: %r", self.ref, exc)
            if not announced:
                LOG.info("another operator holds lease %s; standing by", self.ref)
                announced = True
            await asyncio.sleep(self.lease_seconds / 3)

    async def _renew(self) -> tuple[str, bool] | None:
        """None once renewed, else (what went wrong, whether to step down now rather than retry)."""
        left = self._valid_until - time.monotonic()
        if left <= 0:
            return "not renewed in time", True
        budget = min(left, self.lease_seconds / 3)
        try:
            if await self._attempt(budget):
                return None
            return "another operator took the lease", True
        except TimeoutError:
            return f"no answer within {budget:.1f} s", False
        except KubeError as exc:
            return f"cannot renew: {exc}", False
        except Exception as exc:  # a malformed answer or a bug: leadership cannot be trusted any more
            return f"renewal failed: {exc!r}", True

    async def keep(self, on_lost: Callable[[str], None]) -> None:
        """Renew every third of the lease, sooner after a failed try; call `on_lost` once leadership can no
        longer be trusted, at the latest when the validity deadline passes. Returns only after `on_lost`."""
        pause = self.lease_seconds / 3
        while True:
            await asyncio.sleep(max(0.0, min(pause, self._valid_until - time.monotonic())))
            outcome = await self._renew()
            if outcome is None:
                pause = self.lease_seconds / 3
                continue
            problem, final = outcome
            if final or not self.leading():
                self._valid_until = 0.0  # fenced from now on, whatever on_lost does
                on_lost(f"lost lease {self.ref}: {problem}")
                return
            LOG.warning("lease %s: %s; retrying", self.ref, problem)
            pause = self.lease_seconds / 10

    async def release(self) -> None:
        """Hand the Lease back on a clean stop, so a standby takes over without waiting for expiry. Writes
        are fenced first: nothing of this process may land after a standby has started."""
        self._valid_until = 0.0
        try:
            async with asyncio.timeout(self.lease_seconds / 3):
                lease = await self.kube.get(self.ref)
                if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                    return
                manifest = lease_manifest(self.ref, self.identity, 1, lease)
                manifest["spec"]["holderIdentity"] = ""
                await self.kube.replace(manifest)
        except (KubeError, TimeoutError) as exc:
            LOG.warning("could not release lease %s: %s", self.ref, exc or "no answer in time")


@asynccontextmanager
async def standby_health(liveness_url: str | None) -> AsyncIterator[None]:
    """Answer the liveness probe while standing by: kopf serves it only once this process leads, and a
    standby replica killed by its probe would restart in a loop. Closed before kopf binds the port."""
    if not liveness_url:
        yield
        return
    endpoint = urllib.parse.urlsplit(liveness_url)

    async def alive(request: web.Request) -> web.Response:
        return web.json_response({"standby": "waiting for the leader-election Lease"})

    app = web.Application()
    app.router.add_get(endpoint.path or "/", alive)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, endpoint.hostname, endpoint.port).start()
    try:
        yield
    finally:
        await runner.cleanup()
