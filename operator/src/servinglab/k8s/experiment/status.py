"""One experiment as a reconcile pass sees it, and the only writer of its status.

The status is the typed :class:`~servinglab.api.status.ExperimentStatus`: every change is validated as that
model before it is sent (a JSON merge patch of the changed fields), so nothing the CRD's generated schema
would prune or refuse is ever written. Events are recorded on every transition. Used by every step of the
experiment reconciler.
"""

from __future__ import annotations

import logging
from typing import Any

from servinglab.api import GROUP_VERSION, KIND
from servinglab.api import conditions as cond
from servinglab.api.reasons import Reason
from servinglab.api.results import LevelResult, PeakRate
from servinglab.api.states import ExperimentState
from servinglab.api.status import ExperimentStatus, ExperimentSummary
from servinglab.k8s import builders
from servinglab.k8s import metrics as opmetrics
from servinglab.k8s.client import Kube, KubeError, Ref
from servinglab.k8s.settings import Settings
from servinglab.measure.levels import best_level
from servinglab.servers.base import Manifest

LOG = logging.getLogger("servinglab.operator")


def summary_of(
    levels: list[LevelResult], slo: float | None, state: ExperimentState, peak_rate: PeakRate | None = None
) -> ExperimentSummary:
    """What `kubectl get servingexperiments` shows of finished results: the best level within the SLO."""
    best = best_level(levels, slo)
    verdict = next((level.verdict for level in levels if best is not None and level.verdict is not None
                    and (level.concurrency, level.rate_rps) == (best.concurrency, best.rate_rps)), None)  # fmt: skip
    return ExperimentSummary(
        state=state,
        levels=len(levels),
        best_concurrency=best.concurrency if best is not None else None,
        best_rate_rps=best.rate_rps if best is not None else None,
        best_throughput_rps=best.throughput_rps if best is not None else None,
        best_p99_latency_ms=best.p99_latency_ms if best is not None else None,
        peak_rate_rps=peak_rate.rate_rps if peak_rate is not None else None,
        verdict=str(verdict.bottleneck) if verdict is not None else None,
    )


class Experiment:
    """One experiment's view of the cluster for a single reconcile pass."""

    def __init__(self, kube: Kube, body: Manifest, settings: Settings) -> None:
        self.kube = kube
        self.body = body
        self.settings = settings
        meta = body["metadata"]
        self.name, self.namespace, self.uid = meta["name"], meta["namespace"], meta["uid"]
        self.generation: int | None = meta.get("generation")
        self.ref = Ref(GROUP_VERSION, KIND, self.namespace, self.name)
        self.owner = builders.Owner(self.name, self.namespace, self.uid)
        self.names = builders.Names(self.name)
        self.status = ExperimentStatus.model_validate(body.get("status") or {})
        # read raw: the cleanup of an experiment whose spec was invalid still runs (and finds nothing)
        cleanup = ((body.get("spec") or {}).get("cleanup") or {}).get("deleteServer", True)
        self.delete_server_when_done = cleanup is not False

    @property
    def conditions(self) -> list[cond.Condition]:
        return self.status.conditions

    @property
    def state(self) -> ExperimentState | None:
        return self.status.summary.state if self.status.summary is not None else None

    def child(self, api_version: str, kind: str, name: str) -> Ref:
        return Ref(api_version, kind, self.namespace, name)

    async def patch(self, **changes: Any) -> None:
        """Set status fields (snake_case names of :class:`ExperimentStatus`), validated, then merge-patched."""
        updated = ExperimentStatus.model_validate({**dict(self.status), **changes})
        written = updated.model_dump(mode="json", by_alias=True, exclude_none=True, include=set(changes))
        for name, value in changes.items():
            if value is None:  # a merge patch's null removes the field
                written[ExperimentStatus.model_fields[name].alias or name] = None
        self.status = updated
        await self.kube.patch_status(self.ref, written)

    async def set(self, kind: str, status: bool | None, reason: Reason, message: str, **changes: Any) -> None:
        conditions = cond.set_condition(self.conditions, kind, status, reason, message, self.generation)
        await self.patch(conditions=conditions, observed_generation=self.generation, **changes)

    async def event(self, kind: str, reason: str, message: str) -> None:
        """A Kubernetes event on the experiment; failing to record one never fails the experiment."""
        now = cond.now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.name}.", "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": GROUP_VERSION,
                "kind": KIND,
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
            },
            "type": kind,
            "reason": reason,
            "message": message[:1000],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "servinglab-operator"},
        }
        try:
            await self.kube.create(event)
        except KubeError as exc:
            LOG.warning("could not record event %s for %s: %s", reason, self.ref, exc)

    async def fail(self, reason: Reason, message: str) -> None:
        """End the experiment as Failed; the cleanup then stops its load and frees its GPU."""
        conditions = cond.set_condition(self.conditions, cond.FAILED, True, reason, message, self.generation)
        conditions = cond.set_condition(conditions, cond.SUCCEEDED, False, reason, message, self.generation)
        failed = ExperimentState.FAILED
        summary = (self.status.summary or ExperimentSummary(state=failed)).model_copy(update={"state": failed})
        await self.patch(conditions=conditions, summary=summary, finished_at=cond.now())
        await self.event("Warning", reason, message)
        opmetrics.finished(self.namespace, self.name, failed)

    async def owned(self, ref: Ref) -> Manifest | None:
        """The child if this incarnation of the experiment owns it, else None (absent, or a predecessor's)."""
        child = await self.kube.get(ref)
        return child if child is not None and builders.owned_by(child, self.uid) else None

    async def delete_owned(self, ref: Ref) -> None:
        if await self.owned(ref) is not None:
            await self.kube.delete(ref)
