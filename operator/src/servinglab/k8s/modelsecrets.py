"""The Secrets the operator makes for a server's model (pure builders, beside :mod:`.builders`).

- A pre-signed model URL's whole form: its query string is a credential, and the experiment's ConfigMap
  (which the `view` role reads) holds the URL redacted; the model init container alone gets it.
- The key that signs the model cache's build manifests (:mod:`servinglab.models.digests`), one per
  namespace: whoever can write the shared cache claim cannot forge a manifest without it.

The operator creates both and never reads them (it has no get on Secrets). Used by the experiment
reconciler.
"""

from __future__ import annotations

import base64
import secrets

from servinglab.api import ExperimentSpec
from servinglab.api.modelref import redact_url
from servinglab.k8s.builders import MANAGED_BY, Names, Owner, labels, owner_reference
from servinglab.models.fetch import MODEL_URL_KEY
from servinglab.servers.base import Manifest
from servinglab.servers.podparts import MODEL_CACHE_KEY_FIELD


def needs_model_url_secret(spec: ExperimentSpec) -> bool:
    """Whether the model's URL has a query string or fragment (a pre-signed URL's signature), which the
    experiment's ConfigMap holds redacted (:func:`servinglab.k8s.experiment.snapshot.document`)."""
    source = spec.model.source
    return source is not None and source.url is not None and redact_url(source.url) != source.url


def model_url_secret(owner: Owner, url: str) -> Manifest:
    """The model's whole URL, for the server pod's model init container alone (a pre-signed URL's signature
    is a credential: never in the ConfigMap, which the `view` role reads). Created once, named by the API
    server and kept in status, as :func:`~servinglab.k8s.loadbuilders.generator_key_secret` (the operator reads no
    Secret). Immutable."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "generateName": f"{Names(owner.name).server}-model-url-",
            "namespace": owner.namespace,
            "labels": labels(owner, "server"),
            "ownerReferences": [owner_reference(owner)],
        },
        "type": "Opaque",
        "immutable": True,
        "data": {MODEL_URL_KEY: base64.b64encode(url.encode()).decode()},
    }


#: The Secret of the key that signs the model cache's manifests, one per namespace (the cache claim is).
MODEL_CACHE_KEY_SECRET = "servinglab-model-cache-key"


def model_cache_key_secret(namespace: str) -> Manifest:
    """The key the model init containers sign and check the model cache's build manifests with
    (:mod:`servinglab.models.digests`): whoever can write the shared claim cannot forge one. One per
    namespace, as the cache claim: created by the operator when the first experiment there uses the cache,
    kept (no owner: it outlives experiments, as the cache does), never read by the operator. Immutable."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": MODEL_CACHE_KEY_SECRET,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "servinglab",
                "app.kubernetes.io/component": "model-cache",
                "app.kubernetes.io/managed-by": MANAGED_BY,
            },
        },
        "type": "Opaque",
        "immutable": True,
        "data": {MODEL_CACHE_KEY_FIELD: base64.b64encode(secrets.token_hex(32).encode()).decode()},
    }
