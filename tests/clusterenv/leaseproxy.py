"""A tiny HTTP proxy in front of the test API server that can break the Lease calls alone.

`kubectl proxy` reaches the API server with the cluster's credentials; this proxy sits in front of it,
passes every request through (watches stream) and records each one with its arrival time. A test
points an operator's kubeconfig at it and then makes the Lease calls, and only those, misbehave the
way a real API server or network can:

- `hold`: Lease requests get no answer at all (a hung call, a half-open connection);
- `empty`: a Lease GET answers 200 with `{}` (a proxy or a broken API server answering nonsense).

Everything else keeps working, so what the operator does meanwhile is seen in `requests`.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from clusterenv.controlplane import Cluster

#: Hop-by-hop headers and those aiohttp sets itself; everything else passes through unchanged.
_DROPPED = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
_WRITES = {"POST", "PUT", "PATCH", "DELETE"}


@dataclass(frozen=True)
class Request:
    at: float  # time.time() when it arrived
    method: str
    path: str

    @property
    def lease(self) -> bool:
        return "/leases" in self.path

    @property
    def write(self) -> bool:
        return self.method in _WRITES


class LeaseProxy:
    """Start with :meth:`start`, stop with :meth:`stop`; `fault` is None, "hold" or "empty"."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster, self.workdir = cluster, workdir
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._fault: str | None = None
        self._loop = asyncio.new_event_loop()
        self._released = asyncio.Event()
        self._kubectl: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def kubeconfig(self) -> Path:
        """A kubeconfig for an operator that should talk through this proxy (plain HTTP, no credentials)."""
        path = self.workdir / "through-proxy.kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
            "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
        }))  # fmt: skip
        return path

    def break_leases(self, fault: str) -> float:
        """From now on Lease requests meet `fault`; returns when the last Lease write went through
        (time.time() of its arrival), from which a standby's clock for taking over starts at the earliest."""
        with self._lock:
            self._fault = fault
            writes = [r.at for r in self.requests if r.lease and r.write]
        assert writes, "no Lease write went through the proxy before the fault"
        return writes[-1]

    def start(self) -> LeaseProxy:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._kubectl = subprocess.Popen(
            [str(self.cluster.binaries.kubectl), f"--kubeconfig={self.cluster.kubeconfig}", "proxy",
             "--address=127.0.0.1", "--port=0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert self._kubectl.stdout is not None
        line = self._kubectl.stdout.readline()  # "Starting to serve on 127.0.0.1:PORT"
        match = re.search(r":(\d+)\s*$", line)
        assert match, f"kubectl proxy did not start: {line}"
        upstream = f"http://127.0.0.1:{match.group(1)}"
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(upstream, started), daemon=True)
        self._thread.start()
        assert started.wait(30), "the lease proxy did not start"
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._released.set)
            self._thread.join(timeout=20)
        if self._kubectl is not None:
            self._kubectl.terminate()
            self._kubectl.wait(timeout=10)

    def _serve(self, upstream: str, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main(upstream, started))
        self._loop.close()

    async def _main(self, upstream: str, started: threading.Event) -> None:
        session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))

        async def forward(request: web.Request) -> web.StreamResponse:
            with self._lock:
                self.requests.append(Request(time.time(), request.method, request.path))
                fault = self._fault if "/leases" in request.path else None
            if fault == "hold":
                await self._released.wait()  # never answered while the test runs
                raise web.HTTPServiceUnavailable()
            if fault == "empty" and request.method == "GET":
                return web.json_response({})
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
            body = await request.read()
            async with session.request(
                request.method, upstream + request.path_qs, headers=headers, data=body or None
            ) as answer:
                response = web.StreamResponse(
                    status=answer.status,
                    headers={k: v for k, v in answer.headers.items() if k.lower() not in _DROPPED},
                )
                await response.prepare(request)
                async for chunk in answer.content.iter_any():  # watches stream event by event
                    await response.write(chunk)
                await response.write_eof()
                return response

        app = web.Application()
        app.router.add_route("*", "/{path:.*}", forward)
        runner = web.AppRunner(app, shutdown_timeout=1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        started.set()
        await self._released.wait()
        await runner.cleanup()
        # watches still streaming from kubectl proxy to an operator that has gone: end them here
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await session.close()
