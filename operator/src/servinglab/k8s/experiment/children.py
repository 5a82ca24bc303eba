"""Applying an experiment's children (server-side apply), and the refusal that ends it: used by the reconcile
pass (:mod:`.reconcile`) and the load step (:mod:`.loadrun`)."""

from __future__ import annotations

from servinglab.k8s.client import KubeError
from servinglab.k8s.experiment.status import Experiment
from servinglab.servers.base import Manifest


class Refused(Exception):
    """The API server refused to create or change a child (see :data:`~servinglab.k8s.client.REFUSALS`):
    the same request would be refused again, so the experiment ends as Rejected with the API's message.
    A refusal that passes on its own (:data:`~servinglab.k8s.client.PASSING_REFUSALS`) is not one: its
    KubeError fails the pass, and the next poll tries again."""


async def apply_child(experiment: Experiment, manifest: Manifest) -> None:
    """Create or update `manifest`; a refusal that the same request would meet again raises :class:`Refused`."""
    try:
        await experiment.kube.apply(manifest)
    except KubeError as exc:
        if exc.refusal:
            raise Refused(str(exc)) from None
        raise
