"""Leader election when the renewal breaks: the old leader must stop writing before a standby may lead.

The leading operator talks to the API server through a real HTTP proxy (:mod:`clusterenv.leaseproxy`)
that, on cue, stops answering the Lease calls (a hung renewal) or answers a Lease GET with `{}` (a
renewal that raises). Everything else still goes through, and the proxy records every request the
leader sends. A standby beside it, talking to the API server directly, may take over once the Lease
has gone unrenewed for its whole duration; no write of the old leader may arrive from then on.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clusterenv.controlplane import Cluster
from clusterenv.experiments import experiment
from clusterenv.leaseproxy import LeaseProxy
from clusterenv.operatorproc import Operator
from servinglab.k8s.leader import LEASE_NAME

pytestmark = [pytest.mark.k8s]

LEASE_SECONDS = 6.0


def started(cluster: Cluster, namespace: str, name: str) -> bool:
    found = cluster.kubectl.run("get", "sx", name, "-n", namespace, "-o", "json", check=False)
    return found.returncode == 0 and '"startedAt"' in found.stdout


@pytest.mark.parametrize("fault", ["hold", "empty"], ids=["renewal-hangs", "renewal-raises"])
def test_a_leader_that_cannot_renew_stops_writing_before_a_standby_may_take_over(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path, fault: str
) -> None:
    proxy = LeaseProxy(cluster, tmp_path / "proxy").start()
    settings = {"SERVINGLAB_LEASE_SECONDS": str(LEASE_SECONDS)}
    leader = Operator(cluster, namespace, tmp_path / "leader", {**settings, "KUBECONFIG": str(proxy.kubeconfig)},
                      restart=False)  # fmt: skip
    standby = Operator(cluster, namespace, tmp_path / "standby", settings)
    try:
        leader.start()
        cluster.kubectl.wait_for(lambda: "leading as" in leader.log(), 60, "the operator behind the proxy to lead")
        standby.start()
        cluster.kubectl.wait_for(lambda: "standing by" in standby.log(), 60, "a second operator to stand by")
        cluster.kubectl.apply(experiment("before", gpus=0), namespace=namespace)
        cluster.kubectl.wait_for(lambda: started(cluster, namespace, "before"), 60, "the leader to act")

        renewed = proxy.break_leases(fault)
        may_take_over = renewed + LEASE_SECONDS  # unrenewed for a whole lease, as the standby sees it
        time.sleep(max(0.0, may_take_over + 1 - time.time()))
        cluster.kubectl.apply(experiment("after", gpus=0), namespace=namespace)
        cluster.kubectl.wait_for(lambda: started(cluster, namespace, "after"), 60, "the standby to take over")

        writes = [r for r in proxy.requests if r.write and not r.lease]
        assert writes, "the leader wrote nothing through the proxy: this test could not see a late write"
        late = [f"{r.method} {r.path} at +{r.at - renewed:.1f} s" for r in writes if r.at >= may_take_over]
        assert not late, f"the old leader wrote after a standby could lead: {late}\n{leader.log()}"
        assert leader.process is not None and leader.process.poll() == 70, leader.log()
        assert "lost lease" in leader.log()
        lease = cluster.kubectl.get("lease", LEASE_NAME, "-n", namespace)
        assert standby.process is not None and f"-{standby.process.pid}-" in lease["spec"]["holderIdentity"]
    finally:
        cluster.kubectl.run("delete", "sx", "--all", "-n", namespace, "--wait=true", "--timeout=30s", check=False)
        standby.stop()
        leader.stop()
        proxy.stop()
