"""The spec a started experiment runs on: validated once, when it starts, and read back from then on.

The live spec is validated before an experiment starts and never again: a chart upgrade mid-run (a CRD
that defaults a new field into every stored spec, an operator whose checks are stricter) must not fail an
experiment that is already running, nor change what it runs. The snapshot is the validated document, its
defaults filled in, that the experiment's ConfigMap (`<name>-config`, key `experiment.yaml`) already
holds for the server's model init container and the load Job: so what the operator reads back is, by
construction, what the children run on. It is not a new object, nor a field of status (which the CRD's
schema would default and prune like the spec); the API server bounds a ConfigMap to 1 MiB, and a
snapshot is refused beyond that or when its YAML uses aliases (a small text that expands without bound).

Written by the experiment reconciler with the children (:func:`document`); read back by it once per
daemon run (kept in :class:`Pinned`), not every pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from servinglab.api import GROUP_VERSION, KIND, ExperimentSpec, SpecError, parse_experiment
from servinglab.api.modelref import redact_url
from servinglab.k8s import builders
from servinglab.k8s.experiment.status import Experiment
from servinglab.servers.base import Manifest

#: The most text a snapshot may have: a ConfigMap's whole limit.
MAX_SNAPSHOT_CHARS = 1024 * 1024


@dataclass
class Pinned:
    """One daemon run's copy of its experiment's snapshot, so that a pass does not read it again."""

    uid: str = ""
    spec: ExperimentSpec | None = None


class _NoAliases(yaml.SafeLoader):
    """YAML as yaml.safe_dump writes a validated document: no anchors, no aliases."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("aliases are not allowed in a snapshot")
        return super().compose_node(parent, index)


def document(name: str, spec: ExperimentSpec) -> Manifest:
    """The experiment as its children read it and as it is kept (pure): the validated spec, defaults in, the
    model URL's query string redacted (a pre-signed URL's signature: the `view` role reads ConfigMaps; the
    model init container gets the whole URL from a Secret, :func:`~servinglab.k8s.builders.model_url_secret`)."""
    source = spec.model.source
    if source is not None and source.url is not None:
        redacted = source.model_copy(update={"url": redact_url(source.url)})
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"source": redacted})})
    return {
        "apiVersion": GROUP_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": spec.model_dump(by_alias=True, mode="json"),
    }


def parse(text: str, source: str) -> ExperimentSpec:
    """The spec in a snapshot's text (pure); :class:`SpecError` naming what is wrong with it."""
    if len(text) > MAX_SNAPSHOT_CHARS:
        raise SpecError([f"(document): {len(text)} characters, above the limit of {MAX_SNAPSHOT_CHARS}"], source)
    try:
        document = yaml.load(text, Loader=_NoAliases)  # a SafeLoader that refuses aliases
    except yaml.YAMLError as exc:
        raise SpecError([f"(document): not valid YAML: {exc}"], source) from None
    return parse_experiment(document, source).spec


async def read(experiment: Experiment, pinned: Pinned) -> ExperimentSpec | None:
    """The started experiment's snapshot; None when its ConfigMap does not hold one (yet: the operator
    stopped between recording the start and writing the ConfigMap, or someone deleted it)."""
    if pinned.uid == experiment.uid and pinned.spec is not None:
        return pinned.spec
    ref = experiment.child("v1", "ConfigMap", experiment.names.config)
    config = await experiment.owned(ref)
    text = ((config or {}).get("data") or {}).get(builders.EXPERIMENT_FILE)
    if not isinstance(text, str):
        return None
    pinned.uid, pinned.spec = experiment.uid, parse(text, f"{ref} key {builders.EXPERIMENT_FILE}")
    return pinned.spec
