"""The operator's kopf wiring, and nothing else: start-up (settings, the API client, metrics, leader
election, the GPU queue's watch-fed caches), one daemon per ServingExperiment and one per ServingSweep,
each driving its reconciler (:mod:`.experiment.reconcile`, :mod:`.sweep.reconcile`) every few seconds
until it has finished. A queued experiment reads its body from the GPU queue's cache and waits for a
change there rather than polling the API; a deleted experiment's metric series are removed.

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

from servinglab.api import API_GROUP, API_VERSION, GROUP_VERSION, KIND, PLURAL, SWEEP_KIND, SWEEP_PLURAL
from servinglab.api import conditions as cond
from servinglab.api.reasons import Reason
from servinglab.k8s import leader
from servinglab.k8s import metrics as opmetrics
from servinglab.k8s.client import Kube, KubeError, Ref
from servinglab.k8s.experiment import snapshot
from servinglab.k8s.experiment.admission import GpuQueue
from servinglab.k8s.experiment.reconcile import give_up, reconcile
from servinglab.k8s.settings import Settings
from servinglab.k8s.sweep.reconcile import end_sweep, reconcile_sweep
from servinglab.servers.base import Manifest

LOG = logging.getLogger("servinglab.operator")
#: A queued experiment is woken by any change of the GPU queue's caches; this is only a backstop.
QUEUED_POLL_SECONDS = 15.0
#: How long a daemon told to stop (its object finished, the operator exiting) may finish its pass before kopf
#: cancels it. Without it kopf cancels at once: a pass's own status write, which makes its filter false,
#: cancelled that pass at its next await, before the pass's metric series were published.
STOP_GRACE_SECONDS = 10.0


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
        memo=kopf.Memo(watched=None if all_namespaces else sorted(namespaces)),
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
    # Exactly one operator acts: wait here, before any handler runs, until this process leads. The Lease
    # has a client of its own, its calls bounded well under the lease; the reconcilers' client sends no
    # write once leadership may have lapsed (the fence: a local clock check, no API call).
    identity = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    lease_seconds = memo.settings.lease_seconds
    lease_kube = await Kube.connect()
    lease_kube.timeout_seconds = max(lease_seconds / 3, 1.0)
    memo.election = leader.Election(lease_kube, memo.settings.lease_namespace, identity, lease_seconds)
    async with leader.standby_health(os.environ.get("SERVINGLAB_LIVENESS_URL")):
        await memo.election.acquire()
    memo.kube.fence = memo.election.leading
    memo.renewal = asyncio.create_task(memo.election.keep(_lost_leadership))
    memo.renewal.add_done_callback(_renewal_ended)
    # one GPU queue for every watched namespace, fed by watches (started by the leader only)
    memo.queue = GpuQueue(memo.kube, memo.get("watched"), memo.settings.gpu_resource).start()


def _renewal_ended(task: asyncio.Task[None]) -> None:
    """The renewal task never ends while this process leads: if it does (but by a clean stop), step down."""
    if not task.cancelled():
        _lost_leadership(f"the lease renewal ended: {task.exception()!r}")


def _lost_leadership(why: str) -> None:
    """Another operator may act from now on: stop at once, mid-step if need be (every step is idempotent)."""
    LOG.critical("%s; exiting so that only one operator acts", why)
    logging.shutdown()
    os._exit(70)


@kopf.on.cleanup()
async def _cleanup(memo: kopf.Memo, **_: Any) -> None:
    memo.renewal.cancel()
    if "queue" in memo:
        await memo.queue.stop()
    await memo.election.release()
    await memo.kube.close()
    await memo.election.kube.close()


def _running(status: kopf.Status, **_: Any) -> bool:
    """The daemon's filter: not yet finished and cleaned up. Outside it, kopf keeps no finalizer on the
    object (and removes one left from before), so deleting it needs no operator."""
    return not status.get("cleanedUpAt")


def _sweep_running(status: kopf.Status, **_: Any) -> bool:
    return not cond.finished([cond.Condition.model_validate(c) for c in status.get("conditions") or []])


async def _drive(
    ref: Ref,
    step: Callable[[Manifest], Awaitable[bool]],
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    logger: kopf.Logger,
    queued: Callable[[], bool] = lambda: False,
    give_up: Callable[[Manifest, str], Awaitable[None]] | None = None,
) -> None:
    """Reconcile one object every poll until `step` says it has finished or it is gone. While `queued`
    says so, the object is read from the GPU queue's cache and the next pass comes with a change there.
    A pass that fails is retried on the next poll; once passes have failed for `settings.failing_seconds`
    in a row, `give_up(body, why)` ends the object (it is tried again on each later failure until it
    succeeds)."""
    failing_since: float | None = None
    body: Manifest | None = None
    while not stopped:
        try:
            body = memo.queue.body(ref.namespace, ref.name) if queued() else None
            body = body or await memo.kube.get(ref)
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
        if queued():
            waits = [asyncio.ensure_future(stopped.wait(QUEUED_POLL_SECONDS)),
                     asyncio.ensure_future(memo.queue.changed(QUEUED_POLL_SECONDS))]  # fmt: skip
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
        else:
            await stopped.wait(memo.settings.poll_seconds)


@kopf.daemon(
    API_GROUP, API_VERSION, PLURAL, cancellation_backoff=STOP_GRACE_SECONDS, cancellation_timeout=5.0, when=_running
)
async def drive(
    name: str, namespace: str | None, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
) -> None:
    """One per experiment, restarted with the operator: reconcile until finished."""
    ref = Ref(GROUP_VERSION, KIND, namespace or "", name)
    deployed = queued = False
    pinned = snapshot.Pinned()

    async def step(body: Manifest) -> bool:
        nonlocal deployed, queued
        outcome = await reconcile(memo.kube, body, memo.settings, memo.queue, deploy=not deployed, pinned=pinned)
        deployed = deployed or outcome is not None  # once per daemon run, by the first pass past the queue
        cached = memo.queue.body(ref.namespace, name)  # the queue's cache has this pass's own writes
        queued = outcome is None and cached is not None and not (cached.get("status") or {}).get("startedAt")
        return outcome is True

    async def end(body: Manifest, why: str) -> None:
        await give_up(memo.kube, body, memo.settings, why)

    with opmetrics.RUNNING.track_inprogress():
        await _drive(ref, step, memo, stopped, logger, queued=lambda: queued, give_up=end)


@kopf.daemon(
    API_GROUP,
    API_VERSION,
    SWEEP_PLURAL,
    cancellation_backoff=STOP_GRACE_SECONDS,
    cancellation_timeout=5.0,
    when=_sweep_running,
)
async def drive_sweep(
    name: str, namespace: str | None, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
) -> None:
    """One per sweep, restarted with the operator: start trials and roll them up until finished."""
    ref = Ref(GROUP_VERSION, SWEEP_KIND, namespace or "", name)
    chart_prices = memo.settings.pricing.priced()
    await _drive(ref, lambda body: reconcile_sweep(memo.kube, body, memo.queue, chart_prices), memo, stopped, logger,
                 give_up=lambda body, why: end_sweep(memo.kube, body, Reason.RECONCILE_FAILED, why))  # fmt: skip


@kopf.on.event(API_GROUP, API_VERSION, PLURAL)
async def _deleted(event: kopf.RawEvent, name: str, namespace: str | None, **_: Any) -> None:
    """A deleted experiment leaves no metric series behind (no finalizer: this only follows the watch)."""
    if event["type"] == "DELETED":
        opmetrics.forget(namespace or "", name)


@kopf.on.event(API_GROUP, API_VERSION, SWEEP_PLURAL)
async def _sweep_deleted(event: kopf.RawEvent, name: str, namespace: str | None, **_: Any) -> None:
    if event["type"] == "DELETED":
        opmetrics.forget_sweep(namespace or "", name)
