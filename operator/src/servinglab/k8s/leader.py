"""Leader election on a coordination.k8s.io Lease, so that exactly one operator process acts.

Two operator replicas (a rollout surge, a second install watching the same namespaces) would both
reconcile the same experiments: two Jobs, two results. The operator's startup handler blocks in
:meth:`Election.acquire` until it holds the Lease, then :meth:`Election.keep` renews it; a process
that cannot renew before its lease runs out calls `on_lost` (the operator exits at once, before a
standby can take over) and a stopping process releases the Lease so a standby takes over at once.

Expiry is judged the way client-go does: by how long this process has watched the same record
unchanged, not by comparing another host's renewTime with the local clock, so clock skew between
nodes cannot hand the Lease to two holders.
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

LOG = logging.getLogger("servinglab.leader")
LEASE_NAME = "servinglab-operator"


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_manifest(ref: Ref, identity: str, lease_seconds: float, previous: dict[str, Any] | None) -> dict[str, Any]:
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
    metadata: dict[str, Any] = {"name": ref.name, "namespace": ref.namespace}
    if previous is not None:
        metadata["resourceVersion"] = previous["metadata"]["resourceVersion"]
    return {"apiVersion": ref.api_version, "kind": ref.kind, "metadata": metadata, "spec": spec}


@dataclass
class Election:
    """One process's candidacy for the Lease `namespace/name`."""

    kube: Kube
    namespace: str
    identity: str
    lease_seconds: float = 15.0
    name: str = LEASE_NAME
    _observed: tuple[Any, ...] = field(default=(), init=False)
    _observed_at: float = field(default=0.0, init=False)
    _renewed_at: float = field(default=0.0, init=False)

    @property
    def ref(self) -> Ref:
        return Ref("coordination.k8s.io/v1", "Lease", self.namespace, self.name)

    def _expired(self, lease: dict[str, Any]) -> bool:
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        return not spec.get("holderIdentity") or now - self._observed_at > duration

    async def try_acquire(self) -> bool:
        """Take or renew the Lease if it is ours, free or expired; False while another holds it."""
        lease = await self.kube.get(self.ref)
        mine = lease is not None and (lease.get("spec") or {}).get("holderIdentity") == self.identity
        if lease is not None and not mine and not self._expired(lease):
            return False
        manifest = lease_manifest(self.ref, self.identity, self.lease_seconds, lease)
        try:
            await (self.kube.replace(manifest) if lease is not None else self.kube.create(manifest))
        except Conflict:  # another candidate wrote first
            return False
        self._renewed_at = time.monotonic()
        return True

    async def acquire(self) -> None:
        """Wait until this process holds the Lease."""
        announced = False
        while True:
            try:
                if await self.try_acquire():
                    LOG.info("leading as %s (lease %s)", self.identity, self.ref)
                    return
            except KubeError as exc:
                LOG.warning("lease %s: %s", self.ref, exc)
            if not announced:
                LOG.info("another operator holds lease %s; standing by", self.ref)
                announced = True
            await asyncio.sleep(self.lease_seconds / 3)

    async def keep(self, on_lost: Callable[[str], None]) -> None:
        """Renew every third of the lease; call `on_lost` once the lease can no longer be trusted."""
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            taken = False
            try:
                if await self.try_acquire():
                    continue
                taken, problem = True, "another operator took the lease"
            except KubeError as exc:
                problem = f"cannot renew: {exc}"
            # renew deadline: give up well before the lease could expire for the others
            if taken or time.monotonic() - self._renewed_at > self.lease_seconds * 2 / 3:
                on_lost(f"lost lease {self.ref}: {problem}")
                return
            LOG.warning("lease %s: %s; retrying", self.ref, problem)

    async def release(self) -> None:
        """Hand the Lease back on a clean stop, so a standby takes over without waiting for expiry."""
        try:
            lease = await self.kube.get(self.ref)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            manifest = lease_manifest(self.ref, self.identity, 1, lease)
            manifest["spec"]["holderIdentity"] = ""
            await self.kube.replace(manifest)
        except KubeError as exc:
            LOG.warning("could not release lease %s: %s", self.ref, exc)


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
