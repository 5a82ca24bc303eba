"""The operator's only door to the Kubernetes API (kubernetes_asyncio), with errors mapped.

Objects are plain dicts (`Manifest`: untyped JSON, as the API server takes and gives them). Children are
written with server-side apply under one field manager, so a repeated reconcile is a no-op and a restarted
operator converges on the same objects instead of creating duplicates. API failures become
:class:`KubeError` subclasses the handlers can act on.
Collections are also listed page by page and watched (:meth:`Kube.list_all`, :meth:`Kube.watch`) for the
operator's watch-fed caches (:mod:`servinglab.k8s.cache`); what the operator writes is handed to the
callbacks registered with :meth:`Kube.observe`, so that a cache reads its own writes at once.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from servinglab.api import GROUP_VERSION
from servinglab.servers.base import Manifest

FIELD_MANAGER = "servinglab-operator"

_PATHS = {
    ("v1", "ConfigMap"): "/api/v1/namespaces/{namespace}/configmaps",
    ("v1", "Service"): "/api/v1/namespaces/{namespace}/services",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{namespace}/serviceaccounts",
    ("v1", "Secret"): "/api/v1/namespaces/{namespace}/secrets",
    ("v1", "Pod"): "/api/v1/namespaces/{namespace}/pods",
    ("v1", "Event"): "/api/v1/namespaces/{namespace}/events",
    ("v1", "ResourceQuota"): "/api/v1/namespaces/{namespace}/resourcequotas",
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{namespace}/deployments",
    ("batch/v1", "Job"): "/apis/batch/v1/namespaces/{namespace}/jobs",
    ("networking.k8s.io/v1", "NetworkPolicy"): "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies",
    (
        "rbac.authorization.k8s.io/v1",
        "Role",
    ): "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"
    ),
    ("v1", "Node"): "/api/v1/nodes",
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("coordination.k8s.io/v1", "Lease"): "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
    (GROUP_VERSION, "ServingSweep"): (f"/apis/{GROUP_VERSION}/namespaces/{{namespace}}/servingsweeps"),
    (GROUP_VERSION, "ServingExperiment"): (f"/apis/{GROUP_VERSION}/namespaces/{{namespace}}/servingexperiments"),
}


#: What the API server answers to a request it will refuse again however often it is sent: bad request,
#: forbidden (RBAC, an admission policy, a quota), not found (a kind the cluster does not serve, a namespace
#: being deleted), conflict, invalid.
REFUSALS = frozenset({400, 403, 404, 409, 422})

#: A 403 that passes on its own. The API server checks an owner reference with blockOwnerDeletion
#: (OwnerReferencesPermissionEnforcement) by the owner's kind, looked up in a discovery cache it renews
#: every 30 s: for up to that long after a CRD is installed it refuses the children of that CRD's objects
#: with this message, and then admits the same request.
PASSING_REFUSALS = ("cannot find RESTMapping",)


class KubeError(RuntimeError):
    """An API call failed; `status` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status

    @property
    def refusal(self) -> bool:
        """Whether the API server refused the request itself (see REFUSALS) and would refuse it again,
        rather than failed to answer or refused it for a moment (see PASSING_REFUSALS)."""
        return self.status in REFUSALS and not any(passing in str(self) for passing in PASSING_REFUSALS)


class NotFound(KubeError):
    pass


class Forbidden(KubeError):
    pass


class Invalid(KubeError):
    pass


class Conflict(KubeError):
    """409: the object changed since it was read (optimistic concurrency), or already exists."""


class Fenced(KubeError):
    """A write not sent: this process no longer holds the leader-election Lease (:attr:`Kube.fence`)."""


class Gone(KubeError):
    """410: a watch's resourceVersion is older than the API server keeps; list again."""


def _map(exc: ApiException, what: str) -> KubeError:
    try:
        message = json.loads(exc.body or "{}").get("message") or exc.reason
    except (ValueError, AttributeError):
        message = exc.reason
    kind = {404: NotFound, 403: Forbidden, 409: Conflict, 410: Gone, 422: Invalid}.get(exc.status, KubeError)
    return kind(f"{what}: {message}", exc.status)


@dataclass(frozen=True)
class Ref:
    """Which object: api version, kind, namespace, name."""

    api_version: str
    kind: str
    namespace: str
    name: str = ""

    @classmethod
    def of(cls, manifest: Manifest) -> Ref:
        meta = manifest["metadata"]
        return cls(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta.get("name", ""))

    def path(self, subresource: str = "") -> str:
        """The object's path; with no namespace and no name, a namespaced kind's collection in every namespace."""
        template = _PATHS[(self.api_version, self.kind)]
        if not self.namespace:
            template = template.replace("/namespaces/{namespace}", "")
        base = template.format(namespace=self.namespace)
        path = f"{base}/{self.name}" if self.name else base
        return f"{path}/{subresource}" if subresource else path

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


#: One watch event (one object) larger than this is refused: the API server stores objects of about
#: 1.5 MiB at most, so a longer line is not an object of ours, and must not grow the operator's memory.
MAX_EVENT_BYTES = 8 * 1024 * 1024

#: Every call returns within this many seconds (SERVINGLAB_API_TIMEOUT_SECONDS): a half-open
#: connection or a stopped API server must never hang a daemon; the caller retries on its next pass.
API_TIMEOUT_SECONDS = 30.0


class Kube:
    """Async API client; create with :meth:`connect`, close with :meth:`close`."""

    def __init__(self, api: client.ApiClient, timeout_seconds: float | None = None) -> None:
        self._api = api
        self._observers: list[Callable[[Manifest], None]] = []
        self.timeout_seconds = timeout_seconds or float(
            os.environ.get("SERVINGLAB_API_TIMEOUT_SECONDS", API_TIMEOUT_SECONDS)
        )
        #: Writes go out only while this says True (the operator's: its leadership is still valid, a local
        #: clock check); None: always. Reads are never fenced.
        self.fence: Callable[[], bool] | None = None

    @classmethod
    async def connect(cls) -> Kube:
        """In-cluster credentials in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            await config.load_kube_config()
        return cls(client.ApiClient())

    async def close(self) -> None:
        await self._api.close()

    def observe(self, callback: Callable[[Manifest], None]) -> None:
        """Hand every object a write returns (apply, create, replace, status patch) to `callback`."""
        self._observers.append(callback)

    async def _call(
        self,
        method: str,
        path: str,
        what: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Manifest:
        if method != "GET" and self.fence is not None and not self.fence():
            raise Fenced(f"{what}: not sent, this operator no longer leads (its Lease was not renewed in time)")
        try:
            # the client's own timeout covers the socket; wait_for also covers a stuck connection pool
            result = await asyncio.wait_for(
                self._api.call_api(
                    path,
                    method,
                    query_params=query or [],
                    header_params={"Accept": "application/json", "Content-Type": content_type},
                    body=body,
                    response_types_map={200: "object", 201: "object", 202: "object"},
                    auth_settings=["BearerToken"],
                    _return_http_data_only=True,
                    _request_timeout=self.timeout_seconds,
                ),
                self.timeout_seconds + 5,
            )
        except ApiException as exc:
            raise _map(exc, what) from None
        except TimeoutError:
            raise KubeError(f"{what}: no answer within {self.timeout_seconds:g} s") from None
        except (OSError, aiohttp.ClientError) as exc:
            raise KubeError(f"{what}: {exc}") from None
        written = result if isinstance(result, dict) else {}
        if method != "GET" and written.get("metadata"):
            for callback in self._observers:
                callback(written)
        return written

    async def apply(self, manifest: Manifest) -> Manifest:
        """Server-side apply: create or converge the object to `manifest` (idempotent)."""
        ref = Ref.of(manifest)
        return await self._call(
            "PATCH",
            ref.path(),
            f"apply {ref}",
            body=manifest,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )

    async def get(self, ref: Ref) -> Manifest | None:
        try:
            return await self._call("GET", ref.path(), f"get {ref}")
        except NotFound:
            return None

    async def list(
        self, ref: Ref, label_selector: str = "", field_selector: str = "", cached: bool = False
    ) -> list[Manifest]:
        """The objects selected; `cached`: from the API server's watch cache (resourceVersion 0), which
        spares etcd a read of every object of the kind, and may be a moment old."""
        query = [(k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v]
        query += [("resourceVersion", "0")] if cached else []
        result = await self._call("GET", ref.path(), f"list {ref.kind} in {ref.namespace}", query=query)
        items: list[Manifest] = result.get("items", [])
        return items

    async def list_all(
        self, ref: Ref, label_selector: str = "", field_selector: str = "", page: int = 500
    ) -> tuple[builtins.list[Manifest], str]:
        """Every item of a collection, `page` at a time (a big cluster's pods never come in one answer), and
        the resourceVersion to watch it from."""
        items: builtins.list[Manifest] = []
        token = ""
        while True:
            query = [(k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector),
                                         ("limit", str(page)), ("continue", token)) if v]  # fmt: skip
            result = await self._call("GET", ref.path(), f"list {ref.kind} in {ref.namespace or 'all namespaces'}",
                                      query=query)  # fmt: skip
            items.extend(result.get("items") or [])
            meta = result.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    async def watch(
        self, ref: Ref, resource_version: str, label_selector: str = "", field_selector: str = "",
        timeout_seconds: int = 240,
    ) -> AsyncIterator[tuple[str, Manifest]]:  # fmt: skip
        """The changes of a collection after `resource_version`, as (type, object) — ADDED, MODIFIED, DELETED,
        BOOKMARK — until the API server ends the watch (after about `timeout_seconds`). Raises :class:`Gone`
        when that version is too old, :class:`KubeError` on any other failure."""
        what = f"watch {ref.kind} in {ref.namespace or 'all namespaces'}"
        query = [("watch", "true"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(timeout_seconds))]  # fmt: skip
        query += [(k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v]
        # the server ends the watch after timeout_seconds; a silent connection for longer is half-open
        silence = aiohttp.ClientTimeout(total=None, connect=self.timeout_seconds, sock_read=timeout_seconds + 30)
        try:
            response = await asyncio.wait_for(
                self._api.call_api(
                    ref.path(), "GET", query_params=query, header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"], _preload_content=False, _request_timeout=silence,
                ),
                self.timeout_seconds + 5,
            )  # fmt: skip
        except ApiException as exc:
            raise _map(exc, what) from None
        except TimeoutError:
            raise KubeError(f"{what}: no answer within {self.timeout_seconds:g} s") from None
        except (OSError, aiohttp.ClientError) as exc:
            raise KubeError(f"{what}: {exc}") from None
        async with response:
            if response.status != 200:
                refused = ApiException(status=response.status, reason=response.reason)
                refused.body = (await response.content.read(64 * 1024)).decode(errors="replace")
                raise _map(refused, what)
            try:
                async for line in _lines(response.content, what):
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":  # a Status object: 410 when the version is too old
                        status = int(obj.get("code") or 0)
                        raise (Gone if status == 410 else KubeError)(f"{what}: {obj.get('message')}", status)
                    yield str(kind), obj
            except (OSError, aiohttp.ClientError, TimeoutError) as exc:
                raise KubeError(f"{what}: {exc or type(exc).__name__}") from None
            except ValueError as exc:
                raise KubeError(f"{what}: not a watch event: {exc}") from None

    async def delete(self, ref: Ref) -> None:
        with contextlib.suppress(NotFound):
            await self._call("DELETE", ref.path(), f"delete {ref}", body={"propagationPolicy": "Background"})

    async def patch_status(self, ref: Ref, status: Manifest) -> Manifest:
        """Merge-patch the status subresource (conditions and results are whole values)."""
        return await self._call(
            "PATCH",
            ref.path("status"),
            f"patch status of {ref}",
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    async def create(self, manifest: Manifest) -> Manifest:
        ref = Ref.of(manifest)
        collection = Ref(ref.api_version, ref.kind, ref.namespace)  # POST goes to the collection, named or not
        return await self._call("POST", collection.path(), f"create {ref.kind} in {ref.namespace}", body=manifest)

    async def replace(self, manifest: Manifest) -> Manifest:
        """PUT the whole object; with `metadata.resourceVersion` set, a concurrent change raises Conflict."""
        ref = Ref.of(manifest)
        return await self._call("PUT", ref.path(), f"replace {ref}", body=manifest)


async def _lines(stream: aiohttp.StreamReader, what: str) -> AsyncIterator[bytes]:
    """The newline-separated events of a watch, each at most :data:`MAX_EVENT_BYTES`."""
    pending = bytearray()
    async for chunk in stream.iter_any():
        pending += chunk
        if b"\n" in chunk:
            *complete, rest = bytes(pending).split(b"\n")
            pending = bytearray(rest)
            for line in complete:
                if line.strip():
                    yield line
        if len(pending) > MAX_EVENT_BYTES:
            raise KubeError(f"{what}: an event of more than {MAX_EVENT_BYTES} bytes")
    if pending.strip():
        yield bytes(pending)
