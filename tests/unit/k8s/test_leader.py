"""Leader election's local parts: the write fence on the operator's API client, and where the Lease lives."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from servinglab.k8s import settings
from servinglab.k8s.client import Fenced, Kube, KubeError, Ref
from servinglab.servers.process import free_ports

CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x-config", "namespace": "ns"}}
REF = Ref.of(CONFIG_MAP)


async def _outcomes(leading: bool) -> list[str]:
    """What each call does against a port nobody listens on, with the fence saying `leading`."""
    (port,) = free_ports(1)
    kube = Kube(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")), timeout_seconds=5)
    kube.fence = lambda: leading
    calls = {
        "apply": lambda: kube.apply(CONFIG_MAP),
        "create": lambda: kube.create(CONFIG_MAP),
        "replace": lambda: kube.replace(CONFIG_MAP),
        "patch_status": lambda: kube.patch_status(REF, {}),
        "delete": lambda: kube.delete(REF),
        "get": lambda: kube.get(REF),
    }
    outcomes = []
    try:
        for name, call in calls.items():
            try:
                await call()
                outcomes.append(f"{name}: sent")
            except Fenced:
                outcomes.append(f"{name}: fenced")
            except KubeError:  # it went to the network: connection refused
                outcomes.append(f"{name}: sent")
    finally:
        await kube.close()
    return outcomes


def test_a_lapsed_leader_sends_no_write_and_still_reads() -> None:
    assert asyncio.run(_outcomes(leading=False)) == [
        "apply: fenced", "create: fenced", "replace: fenced", "patch_status: fenced", "delete: fenced", "get: sent",
    ]  # fmt: skip
    assert set(asyncio.run(_outcomes(leading=True))) == {
        "apply: sent", "create: sent", "replace: sent", "patch_status: sent", "delete: sent", "get: sent",
    }  # fmt: skip


def test_the_lease_lives_in_the_operators_own_namespace_not_one_it_watches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "namespace"
    monkeypatch.setattr(settings, "SERVICE_ACCOUNT_NAMESPACE", account)
    assert settings.own_namespace({}) == "default"  # outside a cluster, nothing says otherwise
    account.write_text("serving-system\n")  # in a pod: its service account's namespace
    assert settings.own_namespace({}) == "serving-system"
    assert settings.own_namespace({"POD_NAMESPACE": "serving"}) == "serving"  # the chart's downward API
    assert settings.own_namespace({"POD_NAMESPACE": "serving", "SERVINGLAB_LEASE_NAMESPACE": "ops"}) == "ops"
