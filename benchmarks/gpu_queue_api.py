"""The operator's load on a big cluster's API while experiments wait for GPUs, and how soon a freed GPU
is taken.

    .venv/bin/python benchmarks/gpu_queue_api.py [--before COMMIT] [--seconds 60] [--frees 3]

Starts the test control plane (tests/clusterenv: etcd, kube-apiserver, controller manager and
scheduler built from Go modules, KWOK) with 200 simulated nodes in 3 GPU pools — 120 single-T4 nodes,
60 single-L4 nodes, 20 nodes of 8 A100s — and the operator watching one namespace. 20 experiments of
8 A100 GPUs each fill the A100 pool (KWOK runs their server pods, which never get ready, so they hold
the GPUs); then 50 experiments of one A100 GPU each wait in the queue.

The operator talks to the API server through a counting proxy in this process (plain HTTP on
loopback for the operator, TLS with the admin's certificate to the API server), which counts every
request the operator's process makes — kopf's and servinglab's alike — and the bytes each way as they
cross it (compressed as sent: the proxy passes the encoding through). The API server's own
`apiserver_request_total` has no client label, so it cannot tell the operator from KWOK, the
scheduler and the controllers; the proxy can. Reported over `--seconds` of steady state with the 50
queued: requests/s and bytes/s in total and by kind of request, and the operator's CPU.

Then, `--frees` times: one of the 8-GPU experiments is deleted, and the time is taken from the delete
to its server pod being gone (the GPUs free for the scheduler), to the first queued experiment
admitted (`status.startedAt`), and to the eighth (all 8 GPUs taken again).

`--before COMMIT` runs the same on the operator of that commit first (its `operator/src`, from
`git archive`), on a fresh control plane, and prints both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "benchmarks")]

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402
from common import table  # noqa: E402

from clusterenv import manifests  # noqa: E402 (after the path)
from clusterenv.controlplane import (  # noqa: E402
    Cluster,
    Kwok,
    LocalControlPlane,
    build_binaries,
    register_nodes,
    remove_tree,
    wait_default_service_account,
)
from clusterenv.experiments import experiment  # noqa: E402
from clusterenv.kubectl import Kubectl  # noqa: E402
from clusterenv.operatorproc import Operator  # noqa: E402
from servinglab.api.crd import crd_manifest, sweep_crd_manifest  # noqa: E402

NAMESPACE = "bench"
POOLS = (("Tesla-T4", 120, 1), ("NVIDIA-L4", 60, 1), ("A100-SXM4-80GB", 20, 8))
A100 = {"nvidia.com/gpu.product": "A100-SXM4-80GB"}
HOLDERS, HOLDER_GPUS, QUEUED = 20, 8, 50


@dataclass
class Tally:
    requests: Counter[str] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)  # bytes to the API server
    received: Counter[str] = field(default_factory=Counter)  # bytes to the operator


def kind_of(method: str, path: str, query: str) -> str:
    """'LIST nodes', 'WATCH pods', 'PATCH servingexperiments/status', ... from a request's path."""
    parts = [p for p in path.split("/") if p]
    parts = parts[2:] if parts[:1] == ["api"] else parts[3:]  # after /api/v1 or /apis/group/version
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    resource, named, sub = parts[0] if parts else "?", len(parts) > 1, parts[2] if len(parts) > 2 else ""
    verb = "WATCH" if "watch=true" in query else ("GET" if named else "LIST") if method == "GET" else method
    return f"{verb} {resource}{'/' + sub if sub else ''}"


class CountingProxy:
    """HTTP on loopback in front of the API server (TLS, admin certificate); counts what crosses it."""

    def __init__(self, upstream: str, context: ssl.SSLContext) -> None:
        self.upstream, self.context = upstream, context
        self.tally, self.lock = Tally(), threading.Lock()
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.port = 0

    def start(self) -> CountingProxy:
        threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),), daemon=True).start()
        self.ready.wait(30)
        return self

    def reset(self) -> Tally:
        with self.lock:
            tally, self.tally = self.tally, Tally()
        return tally

    def _count(self, kind: str, sent: int = 0, received: int = 0, request: bool = False) -> None:
        with self.lock:
            self.tally.requests[kind] += int(request)
            self.tally.sent[kind] += sent
            self.tally.received[kind] += received

    async def _serve(self) -> None:
        connector = aiohttp.TCPConnector(ssl=self.context, limit=0)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:

            async def forward(request: web.Request) -> web.StreamResponse:
                kind = kind_of(request.method, request.path, request.query_string)
                body = await request.read()
                self._count(kind, sent=len(body) + len(request.raw_path), request=True)
                skip = {"host", "content-length", "transfer-encoding", "connection", "authorization"}
                headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
                timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
                async with session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                           data=body or None, timeout=timeout) as upstream:  # fmt: skip
                    keep = ("content-type", "content-encoding", "cache-control", "audit-id")
                    response = web.StreamResponse(
                        status=upstream.status, headers={k: v for k, v in upstream.headers.items() if k.lower() in keep}
                    )
                    try:
                        await response.prepare(request)
                        async for chunk in upstream.content.iter_any():
                            self._count(kind, received=len(chunk))
                            await response.write(chunk)
                        await response.write_eof()
                    except (ConnectionError, aiohttp.ClientError):
                        pass  # the operator hung up (a watch it ended, a request it gave up on)
                    return response

            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", forward)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            self.ready.set()
            await asyncio.Event().wait()


def proxy_kubeconfig(path: Path, port: int) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
        "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "proxy", "user": {}}],
        "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
    }))  # fmt: skip
    return path


class Api:
    """The admin's own reads (straight to the API server, not counted)."""

    def __init__(self, server: str, context: ssl.SSLContext) -> None:
        self.server, self.context = server, context

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.server + path, context=self.context, timeout=30) as response:
            return json.load(response)

    def started(self) -> dict[str, bool]:
        items = self.get(f"/apis/servinglab.dev/v1alpha1/namespaces/{NAMESPACE}/servingexperiments")["items"]
        return {i["metadata"]["name"]: bool((i.get("status") or {}).get("startedAt")) for i in items}

    def queued(self) -> int:
        items = self.get(f"/apis/servinglab.dev/v1alpha1/namespaces/{NAMESPACE}/servingexperiments")["items"]
        conditions = [(i.get("status") or {}).get("conditions", []) for i in items]
        return sum(1 for listed in conditions if any(c["type"] == "Queued" and c["status"] == "True" for c in listed))

    def server_pods(self, experiment: str) -> int:
        selector = f"servinglab.dev/experiment={experiment},app.kubernetes.io/component=server"
        return len(self.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")["items"])

    def bound_servers(self) -> int:
        pods = self.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app.kubernetes.io/component=server")
        return sum(1 for p in pods["items"] if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp"))


def wait(check: Any, timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def source_of(commit: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "operator/src"], capture_output=True,
                             check=True).stdout  # fmt: skip
    with tempfile.TemporaryFile() as handle:
        handle.write(archive)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(into, filter="data")
    return into / "operator" / "src"


def seed(kubectl: Kubectl) -> None:
    """The 200 nodes (Ready, and without the node controller's not-ready taints), the CRDs, the namespace."""
    nodes = [manifests.node(f"{product.lower()}-{i}", gpus=gpus, product=product)
             for product, count, gpus in POOLS for i in range(count)]  # fmt: skip
    register_nodes(kubectl, nodes, timeout=300)

    def settled() -> bool:  # the node controller lifts its not-ready taints a while after Ready
        taints = [t for n in kubectl.get("nodes")["items"] for t in n["spec"].get("taints", [])]
        return not any(t["key"].startswith("node.kubernetes.io/") for t in taints)

    wait(settled, 300, "the nodes' not-ready taints lifted")
    for manifest in (crd_manifest(), sweep_crd_manifest()):
        kubectl.apply(manifest)
        kubectl.wait_established(manifest["metadata"]["name"])
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})


def spec(name: str, gpus: int) -> dict[str, Any]:
    return experiment(name, gpus=gpus, nodeSelector=A100, startupTimeoutSeconds=3600)


def free_one(kubectl: Kubectl, api: Api, holder: str) -> tuple[float | None, float | None, float | None]:
    """Delete a holder; seconds until its server pod is gone, the first queued one admitted, the 8th."""
    before = {name for name, started in api.started().items() if started}
    t0 = time.monotonic()
    kubectl.run("delete", "sx", holder, "-n", NAMESPACE, "--wait=false")
    gone = first = None
    while time.monotonic() - t0 < 180:
        admitted = {n for n, started in api.started().items() if started and n.startswith("q-")} - before
        now = time.monotonic() - t0
        if gone is None and api.server_pods(holder) == 0:
            gone = now
        if first is None and admitted:
            first = now
        if len(admitted) >= HOLDER_GPUS:
            return gone, first, now
        time.sleep(0.1)
    return gone, first, None


def run(source: Path, seconds: float, frees: int) -> dict[str, Any]:
    binaries = build_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="bench-queue-"))
    control_plane = LocalControlPlane(binaries, workdir)
    kwok: Kwok | None = None
    operator: Operator | None = None
    try:
        control_plane.start()
        kubectl = Kubectl(binaries.kubectl, control_plane.kubeconfig)
        kwok = Kwok(binaries, workdir, control_plane.kubeconfig)
        kwok.start()
        wait_default_service_account(kubectl)
        seed(kubectl)
        cluster = Cluster(control_plane.kubeconfig, kubectl, binaries, control_plane)
        api = Api(control_plane.server, control_plane.admin_context)
        proxy = CountingProxy(control_plane.server, control_plane.admin_context).start()
        env = {"KUBECONFIG": str(proxy_kubeconfig(workdir / "proxy.kubeconfig", proxy.port)),
               "PYTHONPATH": str(source), "SERVINGLAB_POLL_SECONDS": "2"}  # fmt: skip
        operator = Operator(cluster, NAMESPACE, workdir / "operator", extra_env=env).start()
        assert operator.process is not None
        pid = operator.process.pid

        start = time.monotonic()
        for i in range(HOLDERS):
            kubectl.apply(spec(f"hold-{i:02d}", HOLDER_GPUS), namespace=NAMESPACE)
        wait(lambda: api.bound_servers() == HOLDERS, 600, "the A100 pool filled")
        filled = time.monotonic() - start
        for i in range(QUEUED):
            kubectl.apply(spec(f"q-{i:02d}", 1), namespace=NAMESPACE)
        wait(lambda: api.queued() == QUEUED, 600, f"{QUEUED} experiments queued")
        time.sleep(10)  # settle: every queued experiment has written its first Queued condition
        proxy.reset()
        cpu = cpu_seconds(pid)
        time.sleep(seconds)
        tally, cpu = proxy.reset(), cpu_seconds(pid) - cpu

        latencies = []
        for i in range(frees):
            latencies.append(free_one(kubectl, api, f"hold-{i:02d}"))
            placed = HOLDERS - (i + 1) + HOLDER_GPUS * (i + 1)
            wait(lambda placed=placed: api.bound_servers() >= placed, 120, "the admitted servers placed")
        return {"filled": filled, "seconds": seconds, "tally": tally, "cpu": cpu, "frees": latencies,
                "log": operator.log()}  # fmt: skip
    finally:
        if operator is not None:
            operator.stop()
        if kwok is not None:
            kwok.stop()
        control_plane.stop()
        remove_tree(workdir)


def report(label: str, result: dict[str, Any]) -> None:
    tally: Tally = result["tally"]
    seconds = result["seconds"]
    total = sum(tally.requests.values())
    print(f"\n## {label}: {HOLDERS} experiments holding the A100 pool, {QUEUED} queued, {seconds:g} s")
    print(f"A100 pool filled by the queue in {result['filled']:.1f} s; operator CPU {result['cpu'] / seconds:.2f} "
          f"cores; {total / seconds:.1f} requests/s, {sum(tally.received.values()) / seconds / 1024:.1f} KiB/s "
          f"received, {sum(tally.sent.values()) / seconds / 1024:.1f} KiB/s sent")  # fmt: skip
    kinds = sorted(set(tally.requests) | set(tally.received), key=lambda k: -tally.received[k])
    rows = [[kind, f"{tally.requests[kind] / seconds:.2f}", f"{tally.received[kind] / seconds / 1024:.1f}",
             f"{tally.sent[kind] / seconds / 1024:.2f}"] for kind in kinds]  # fmt: skip
    print(table(["request", "per s", "KiB/s received", "KiB/s sent"], rows))
    frees = [[str(i + 1)] + [f"{t:.2f}" if t is not None else "-" for t in times]
             for i, times in enumerate(result["frees"])]  # fmt: skip
    print(table(["free", "holder's pod gone (s)", "first admitted (s)", f"{HOLDER_GPUS} admitted (s)"], frees))
    errors = [line for line in result["log"].splitlines() if re.search(r"ERROR|Traceback", line)]
    if errors:
        print("operator log errors (last 5):\n" + "\n".join(errors[-5:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="also measure the operator of this commit, first")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--frees", type=int, default=3)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop what was started (the finally blocks)
    with tempfile.TemporaryDirectory(prefix="bench-src-") as folder:
        runs = []
        if args.before:
            runs.append((f"before ({args.before})", source_of(args.before, Path(folder))))
        runs.append(("this checkout", REPO / "operator" / "src"))
        for label, source in runs:
            report(label, run(source, args.seconds, args.frees))


if __name__ == "__main__":
    main()
