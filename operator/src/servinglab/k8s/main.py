"""The operator's kopf wiring, and nothing else: start-up (settings, the API client, metrics, leader
election), one daemon per ServingExperiment and one per ServingSweep, each driving its reconciler
(:mod:`.experiment.reconcile`, :mod:`.sweep.reconcile`) every few seconds until it has finished.

Only a finished (and, for an experiment, cleaned-up) object is outside the daemons' filters, so only it
carries no kopf finalizer: it can be deleted (or its namespace, or the CRD) with no operator running.
Exactly one operator process acts at a time (:mod:`.leader`). Run by `servinglab operator`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from servinglab.api import API_GROUP, API_VERSION, KIND, PLURAL, SWEEP_KIND, SWEEP_PLURAL
from servinglab.api import conditions as cond
from servinglab.k8s import leader
from servinglab.k8s import metrics as opmetrics
from servinglab.k8s.client import Kube, KubeError, Ref
from servinglab.k8s.experiment.reconcile import give_up, reconcile
from servinglab.k8s.settings import Settings
from servinglab.k8s.sweep.reconcile import reconcile_sweep

LOG = logging.getLogger("servinglab.operator")


def run_operator(namespaces: list[str], all_namespaces: bool, liveness: str) -> None:
    """Run the operator (kopf's runner) against the current cluster until it is stopped."""
    # our own lines at INFO (leadership, progress); kopf's only from WARNING (a retried reconcile, say)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf").setLevel(logging.WARNING)
    LOG.info("servinglab operator starting")
    settings = kopf.OperatorSettings()
    # Watching named namespaces needs no cluster-wide list of namespaces or CRDs, so a namespaced
    # Role suffices (the Helm chart's default); cluster-wide, kopf keeps noticing CRD changes.
    settings.scanning.disabled = not all_namespaces
    # The leader-election Lease: in the first watched namespace, so any two operators watching the same
    # namespaces (a rollout surge, a second install) contend for the same Lease; cluster-wide, in
    # the operator's own namespace.
    if not os.environ.get("SERVINGLAB_LEASE_NAMESPACE"):
        first = min(namespaces) if namespaces else os.environ.get("POD_NAMESPACE", "default")
        os.environ["SERVINGLAB_LEASE_NAMESPACE"] = first
    os.environ["SERVINGLAB_LIVENESS_URL"] = liveness  # a standby answers it too (servinglab.k8s.leader)
    kopf.run(
        settings=settings,
        standalone=True,  # no kopf peering: the Lease (servinglab.k8s.leader) elects the one acting replica
        clusterwide=all_namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness,
        # kopf's default identity asks the passwd database for the user, which has no entry for the
        # image's UID 65532 (nor for the arbitrary UIDs some clusters assign): the pod's name will do
        identity=socket.gethostname(),  # type: ignore[arg-type]  # a NewType of str kopf does not export
    )


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf keeps its own bookkeeping in annotations under our group, never in our status.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=API_GROUP)
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"
    settings.posting.level = logging.WARNING  # our own events say what happened; kopf's are noise
    # a watch or request on a half-open connection must end, so that kopf reconnects
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    memo.kube = await Kube.connect()
    memo.settings = Settings.from_env()
    opmetrics.start_server()
    # Exactly one operator acts: wait here, before any handler runs, until this process leads.
    identity = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    memo.election = leader.Election(memo.kube, memo.settings.lease_namespace, identity, memo.settings.lease_seconds)
    async with leader.standby_health(os.environ.get("SERVINGLAB_LIVENESS_URL")):
        await memo.election.acquire()
    memo.renewal = asyncio.create_task(memo.election.keep(_lost_leadership))


def _lost_leadership(why: str) -> None:
    """Another operator may act from now on: stop at once, mid-step if need be (every step is idempotent)."""
    LOG.critical("%s; exiting so that only one operator acts", why)
    logging.shutdown()
    os._exit(70)


@kopf.on.cleanup()
async def _cleanup(memo: kopf.Memo, **_: Any) -> None:
    memo.renewal.cancel()
    await memo.election.release()
    await memo.kube.close()


def _running(status: kopf.Status, **_: Any) -> bool:
    """The daemon's filter: not yet finished and cleaned up. Outside it, kopf keeps no finalizer on the
    object (and removes one left from before), so deleting it needs no operator."""
    return not status.get("cleanedUpAt")


def _sweep_running(status: kopf.Status, **_: Any) -> bool:
    return not cond.finished([cond.Condition.model_validate(c) for c in status.get("conditions") or []])


async def _drive(
    ref: Ref,
    step: Callable[[dict[str, Any]], Awaitable[bool]],
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    logger: kopf.Logger,
    give_up: Callable[[dict[str, Any], str], Awaitable[None]] | None = None,
) -> None:
    """Reconcile one object every poll until `step` says it has finished or it is gone. A pass that fails
    is retried on the next poll; once passes have failed for `settings.failing_seconds` in a row,
    `give_up(body, why)` ends the object (it is tried again on each later failure until it succeeds)."""
    failing_since: float | None = None
    body: dict[str, Any] | None = None
    while not stopped:
        try:
            body = await memo.kube.get(ref)
            if body is None:
                return
            if await step(body):
                return
            failing_since = None
        except Exception as exc:  # every failure is retried, and bounded: none may stop the daemon
            opmetrics.RECONCILE_ERRORS.labels(reason=type(exc).__name__).inc()
            unexpected = not isinstance(exc, KubeError)
            logger.warning("Reconcile of %s failed, retrying: %s", ref, exc, exc_info=unexpected)
            failing_since = failing_since or time.monotonic()
            failing = time.monotonic() - failing_since
            if give_up is not None and body is not None and failing >= memo.settings.failing_seconds:
                why = f"its reconcile passes kept failing for {failing:.0f} s; the last error: {exc}"
                try:
                    await give_up(body, why)
                    return
                except Exception as again:
                    logger.warning("Ending %s after failed passes failed too, retrying: %s", ref, again)
        await stopped.wait(memo.settings.poll_seconds)


@kopf.daemon(API_GROUP, API_VERSION, PLURAL, cancellation_timeout=5.0, when=_running)
async def drive(
    name: str, namespace: str | None, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
) -> None:
    """One per experiment, restarted with the operator: reconcile until finished."""
    ref = Ref(f"{API_GROUP}/{API_VERSION}", KIND, namespace or "", name)
    deployed = False

    async def step(body: dict[str, Any]) -> bool:
        nonlocal deployed
        outcome = await reconcile(memo.kube, body, memo.settings, deploy=not deployed)
        deployed = deployed or outcome is not None  # once per daemon run, by the first pass past the queue
        return outcome is True

    async def end(body: dict[str, Any], why: str) -> None:
        await give_up(memo.kube, body, memo.settings, why)

    with opmetrics.RUNNING.track_inprogress():
        await _drive(ref, step, memo, stopped, logger, end)


@kopf.daemon(API_GROUP, API_VERSION, SWEEP_PLURAL, cancellation_timeout=5.0, when=_sweep_running)
async def drive_sweep(
    name: str, namespace: str | None, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
) -> None:
    """One per sweep, restarted with the operator: start trials and roll them up until finished."""
    ref = Ref(f"{API_GROUP}/{API_VERSION}", SWEEP_KIND, namespace or "", name)
    await _drive(ref, lambda body: reconcile_sweep(memo.kube, body), memo, stopped, logger)
