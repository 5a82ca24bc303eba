"""Where the load Job puts its results: the experiment's results ConfigMap, through the API.

The Job runs as a per-experiment ServiceAccount that may only get/patch that one ConfigMap. This
uses the pod's in-cluster credentials (token, CA, KUBERNETES_SERVICE_HOST/PORT) with the standard
library only, because the load-generating process is gevent-patched and needs no async client.
`SERVINGLAB_SERVICEACCOUNT_DIR` replaces the mounted credentials folder (tests use it to run the
Job's command as its ServiceAccount outside a pod).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RESULTS_KEY = "results.json"


class SinkError(RuntimeError):
    """Writing the results failed; the message carries the API's answer."""


def _credentials_dir() -> Path:
    return Path(os.environ.get("SERVINGLAB_SERVICEACCOUNT_DIR", SERVICEACCOUNT_DIR))


def write_results(configmap: str, document: dict[str, Any], namespace: str | None = None) -> None:
    """Merge `results.json` into the ConfigMap `configmap` of this pod's namespace."""
    credentials = _credentials_dir()
    try:
        token = (credentials / "token").read_text().strip()
        namespace = namespace or os.environ.get("POD_NAMESPACE") or (credentials / "namespace").read_text().strip()
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    except (OSError, KeyError) as exc:
        raise SinkError(f"no in-cluster credentials to write results with: {exc}") from None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    url = f"https://{host}:{port}/api/v1/namespaces/{namespace}/configmaps/{configmap}"
    body = json.dumps({"data": {RESULTS_KEY: json.dumps(document, separators=(",", ":"))}}).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="PATCH",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/merge-patch+json",
            "Accept": "application/json",
        },
    )
    context = ssl.create_default_context(cafile=str(credentials / "ca.crt"))
    try:
        with urllib.request.urlopen(request, context=context, timeout=30):
            pass
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise SinkError(f"PATCH configmap {namespace}/{configmap}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise SinkError(f"PATCH configmap {namespace}/{configmap}: {exc}") from None
