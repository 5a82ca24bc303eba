"""A capacity plan checked by running it, on the real node (issue 32, item 2).

The server is the fixed-latency built-in model (model-store/fixed-latency: every forward waits SERVICE_MS and
computes almost nothing) on TorchServe with one worker and batches of one, so a replica serves one request at
a time and its capacity is about 1000 / SERVICE_MS requests a second whatever the host's CPU does: the wait
takes no CPU, so two replicas carry twice one's load even on a busy or slow host (a CPU-bound model's
replicas share the host's cores, and on a shared 2-core host two of them served about one's worth).

One replica is measured saturated (closed loop, more users than it serves at once: its throughput is its
capacity), a plan is made for a peak of PEAK_OVER_CAPACITY x that capacity with HEADROOM (so it plans 2
replicas), and the exported plan check (:mod:`servinglab.sweep.plancheck`: a step rising to the peak and
holding it) runs at the plan's replicas and one fewer, side by side. The margins are wide both ways: at the
plan each replica carries 0.65 x its capacity (Poisson arrivals on a fixed service time, split by the
Service's connections: a p99 of 6-10 service times, against an SLO of 30); one below, the one replica is
offered 1.3 x its capacity and falls 0.3 x capacity x the step's length behind (over the ~38 s peak step:
about 100 requests, 11 s, almost four times the SLO).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.podstate import describe
from servinglab.api import ExperimentSpec
from servinglab.api.capacity import CapacitySpec
from servinglab.api.results import LoadJobResults
from servinglab.k8s.follow import experiment_of
from servinglab.models.catalogue import get_builtin
from servinglab.sweep import plan, plancheck

pytestmark = [pytest.mark.k8s, pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(2400)]

MODEL = "fixed-latency"


def service_ms() -> float:
    """The model's service time, as its definition says (read, not imported: no torch in this process)."""
    found = re.search(r"^SERVICE_MS = (\d+)", get_builtin(MODEL).source.read_text(), re.MULTILINE)
    assert found is not None, "model-store/fixed-latency/model.py no longer says SERVICE_MS"
    return float(found.group(1))


SERVICE_MS = service_ms()
#: The SLO, in service times: queueing at 0.65 of capacity stays well within it (a p99 near 10 service times
#: was seen), an overloaded queue far past it (about 100 behind by the end of the peak step).
SLO_SERVICE_TIMES = 30
SLO_MS = SLO_SERVICE_TIMES * SERVICE_MS
HEADROOM = 0.25
PEAK_OVER_CAPACITY = 1.3  # ceil(1.3 / (1 - 0.25)) = 2 replicas, each at 0.65 x capacity; one alone at 1.3 x
#: Users of the capacity measurement: more than the one request a replica serves at once, so it never idles.
USERS = 3
#: Small requests, so that three servers and two load pods fit the node; the wait needs no CPU.
SERVER_RESOURCES = {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
LOAD_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def capacity_experiment(name: str) -> dict[str, Any]:
    """One replica of the fixed-latency model kept busy: its throughput is its capacity."""
    manifest = experiment(name, gpus=0, nodeSelector={}, tolerations=[], batchSize=1, maxBatchDelayMs=1, workers=1,
                          resources=SERVER_RESOURCES)  # fmt: skip
    manifest["spec"]["model"] = {"name": MODEL}
    manifest["spec"]["load"] = {
        "mode": "closed", "concurrency": [USERS], "warmupSeconds": 3, "durationSeconds": 15,
        "resources": LOAD_RESOURCES,
    }  # fmt: skip
    manifest["spec"]["slo"] = {"p99LatencyMs": SLO_MS}
    return manifest


def full_results(cluster: Cluster, namespace: str, body: dict[str, Any]) -> LoadJobResults:
    """The results document the load Job wrote (the status keeps no phases)."""
    stored = cluster.kubectl.get("configmap", body["status"]["resultsRef"]["name"], "-n", namespace)
    return LoadJobResults.model_validate(json.loads(stored["data"]["results.json"]))


def finished(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    body = wait_finished(cluster, namespace, name, lambda: describe(cluster, namespace), timeout=600)
    assert condition(body, "Succeeded")["status"] == "True", (body["status"], describe(cluster, namespace))
    return body


def test_the_plan_holds_at_its_peak_and_breaks_one_replica_below(cluster: Cluster, installed: str) -> None:
    begun = time.monotonic()
    measure = capacity_experiment("plan-capacity")
    cluster.kubectl.apply(measure, namespace=installed)
    measured = finished(cluster, installed, "plan-capacity")
    spec = ExperimentSpec.model_validate(measured["spec"])
    document = experiment_of(measured).results  # the results document `servinglab results` gives
    one = plan.of_experiment(document, CapacitySpec(), None)
    assert one.capacity_rps is not None, document.results
    # a replica serves one request at a time: kept busy by USERS users, it answers at most one per service time
    assert one.capacity_rps <= 1.05 * 1000 / SERVICE_MS, document.results
    peak = round(PEAK_OVER_CAPACITY * one.capacity_rps, 2)
    found = plan.of_experiment(document, CapacitySpec(peak_rps=peak, headroom=HEADROOM), None)
    assert found.replicas == 2, found
    print(f"one replica ({MODEL}, {SERVICE_MS:g} ms a request): {one.capacity_rps:g} rps with {USERS} users "
          f"(mean {one.latency_mean_ms} ms); peak {peak:g} rps, headroom {HEADROOM}: plan {found.replicas} "
          f"replicas; SLO p99 {SLO_MS:g} ms")  # fmt: skip

    # the plan and one replica fewer, side by side: the waits need no CPU, so neither slows the other
    counts = (found.replicas, found.replicas - 1)
    for replicas in counts:
        manifest = plancheck.check_manifest(f"plan-check-{replicas}", "servinglab.dev/v1alpha1", spec, found, replicas)
        cluster.kubectl.apply(manifest, namespace=installed)
    outcomes: dict[int, tuple[bool, float | None]] = {}
    for replicas in counts:
        body = finished(cluster, installed, f"plan-check-{replicas}")
        assert body["status"]["serverReplicas"] == replicas, body["status"]
        assert len(body["status"]["serverPods"]) == replicas
        (level,) = full_results(cluster, installed, body).results
        held, p99 = plancheck.verdict(level, SLO_MS)
        outcomes[replicas] = (held, p99)
        phase = plancheck.peak_phase(level)
        bound = level.latency_ms.p99_interval.upper if level.latency_ms.p99_interval else None
        print(f"{replicas} replica(s) at the peak step: offered {phase.rate_rps if phase else None} rps, answered "
              f"{phase.throughput_rps if phase else None} rps, p99 {p99} ms (SLO {SLO_MS:g}); whole run p99 "
              f"{level.latency_ms.p99} ms, upper bound {bound}, meets SLO {level.meets_slo}, "
              f"errors {level.errors}/{level.requests}: {'holds' if held else 'breaks'}")  # fmt: skip
    needed = min((count for count, (held, _) in outcomes.items() if held), default=None)
    print(f"planned {found.replicas} replicas, needed {needed}; {time.monotonic() - begun:.0f} s")
    assert outcomes[found.replicas][0], f"the SLO broke at the plan: {outcomes}"
    assert not outcomes[found.replicas - 1][0], f"the SLO held one replica below the plan: {outcomes}"
