"""The watch-fed cache's store: what the operator wrote itself is read back at once, and neither a late
watch event nor a list taken before the write takes it back (the GPU queue relies on this: an admission
it has written must count before the watch brings it). And a watch that fails in a way nobody expected is
started again, listing afresh, and the GPU queue says so meanwhile (the real client, against an API server
on loopback)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from prometheus_client import REGISTRY

from servinglab.k8s.cache import Informer
from servinglab.k8s.client import Kube, Ref
from servinglab.k8s.experiment.admission import GpuQueue


def obj(name: str, version: int, state: str = "queued") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": str(version)}, "state": state}


def store() -> tuple[Informer[str], list[int]]:
    changes: list[int] = []
    informer = Informer(
        cast(Kube, None),  # the store's logic needs no API: run() is what lists and watches
        Ref("v1", "Pod", "ns"),
        lambda o: None if o["state"] == "done" else str(o["state"]),
        on_change=lambda: changes.append(1),
    )
    return informer, changes


def test_the_operators_own_write_is_read_at_once_and_a_late_event_does_not_undo_it() -> None:
    informer, changes = store()
    informer.event("ADDED", obj("a", 10))
    informer.offer(obj("a", 12, "admitted"))  # what a status patch returned
    assert informer.get("ns", "a") == "admitted"
    informer.event("MODIFIED", obj("a", 11, "queued"))  # the watch, still behind
    assert informer.get("ns", "a") == "admitted"
    informer.event("MODIFIED", obj("a", 12, "admitted"))
    informer.event("MODIFIED", obj("a", 13, "queued"))  # a later change by someone else wins
    assert informer.get("ns", "a") == "queued"
    assert len(changes) == 3  # added, admitted, queued again: an equal digest is no change


def test_an_object_whose_digest_is_none_is_dropped_and_a_stale_event_does_not_bring_it_back() -> None:
    informer, _ = store()
    informer.event("ADDED", obj("a", 10))
    informer.offer(obj("a", 12, "done"))
    assert informer.get("ns", "a") is None
    informer.event("MODIFIED", obj("a", 11))
    assert informer.get("ns", "a") is None
    informer.event("DELETED", obj("b", 14))
    informer.event("MODIFIED", obj("a", 15))  # past the write: the watch speaks for it again
    assert informer.get("ns", "a") == "queued"


def test_a_list_drops_what_is_gone_but_keeps_a_write_newer_than_itself() -> None:
    informer, _ = store()
    informer.replace([obj("a", 10), obj("b", 10)], "10")
    informer.offer(obj("c", 21, "admitted"))  # created and written while the next list was on its way
    informer.offer(obj("a", 22, "admitted"))
    informer.replace([obj("a", 19)], "20")
    assert informer.values() == ["admitted", "admitted"]
    assert informer.get("ns", "b") is None


# -- a watch that fails in a way the client does not expect ------------------------------------------------


class ApiServer:
    """An API server's list and watch on loopback, for nodes (two GPUs each) and empty lists of anything else.
    Its first node watch adds a node behind the watcher's back and then sends a line that is JSON but no event
    (`null`, as a misbehaving proxy might): the client raises AttributeError, which it maps to no KubeError.
    The node list that follows waits for `relist` (so the test sees the cache while it is broken)."""

    def __init__(self) -> None:
        self.nodes = ["gpu-a"]
        self.version = 10
        self.lists = 0
        self.watches = 0
        self.relist = asyncio.Event()
        self.stop = asyncio.Event()

    def node(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "resourceVersion": str(self.version)},
                "status": {"allocatable": {"nvidia.com/gpu": "2"}}}  # fmt: skip

    async def handle(self, request: web.Request) -> web.StreamResponse:
        nodes = request.path == "/api/v1/nodes"
        if request.query.get("watch") != "true":
            if nodes:
                self.lists += 1
                if self.lists > 1:
                    await self.relist.wait()
            items = [self.node(name) for name in self.nodes] if nodes else []
            return web.json_response({"metadata": {"resourceVersion": str(self.version)}, "items": items})
        response = web.StreamResponse()
        await response.prepare(request)
        if nodes:
            self.watches += 1
            if self.watches == 1:
                self.version += 1
                self.nodes.append("gpu-b")  # a change this watch will never deliver
                await response.write(b"null\n")
                return response
        await self.stop.wait()  # every other watch stays open, silent, until the test ends
        return response


async def _a_failing_watch_is_restarted(caplog: pytest.LogCaptureFixture) -> None:
    server = ApiServer()
    app = web.Application()
    app.router.add_get("/{tail:.*}", server.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    kube = Kube(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")), timeout_seconds=5)
    queue = GpuQueue(kube, ["ns"]).start()
    before = REGISTRY.get_sample_value("servinglab_watch_restarts_total", {"kind": "Node"}) or 0.0
    try:
        # the watch failed: the queue knows, says why, and does not decide on a view that may be stale
        async with asyncio.timeout(30):
            while (said := queue.unsynced()) is None or "failed" not in said:
                await asyncio.sleep(0.05)
        assert "the watch of Nodes in all namespaces failed (AttributeError" in said, said
        assert [n.name for n in queue.nodes.values()] == ["gpu-a"]
        server.relist.set()
        async with asyncio.timeout(30):  # listed again: the change the broken watch missed is there
            while queue.unsynced() is not None or len(queue.nodes.values()) < 2:
                await asyncio.sleep(0.05)
        assert sorted(n.name for n in queue.nodes.values()) == ["gpu-a", "gpu-b"]
        assert queue.nodes.restarts == 1 and server.lists == 2
        after = REGISTRY.get_sample_value("servinglab_watch_restarts_total", {"kind": "Node"})
        assert after == before + 1
        logged = [r for r in caplog.records if r.name == "servinglab.cache" and r.levelno == logging.ERROR]
        assert len(logged) == 1 and logged[0].exc_info is not None, logged
        assert "the watch of Nodes in all namespaces failed" in logged[0].getMessage()
    finally:
        server.stop.set()
        await queue.stop()
        await kube.close()
        await runner.cleanup()


def test_a_watch_that_fails_unexpectedly_is_restarted_and_the_queue_says_so(caplog: pytest.LogCaptureFixture) -> None:
    asyncio.run(_a_failing_watch_is_restarted(caplog))
