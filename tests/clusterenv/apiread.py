"""Reads from the test cluster's API server in-process, for the loops that poll it.

A `kubectl get` starts a process: about 0.1 s of CPU on CI's machines, and the API server's share on
top. The stand-in kubelet lists its namespace's pods twice a second and the tests poll their experiments,
so a cluster session ran about 7 000 of them, a sixth of its CPU (process accounting: kubectl's 11.5
CPU-minutes of 74). `Kubectl.read` (kubectl.py) comes here for a kubeconfig with a client
certificate or a token, as the local control plane's and kind's are, and falls back to `kubectl get --raw`
for any other (an exec plugin). Writes always go through kubectl.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import tempfile
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

# bounds what one answer may hold (a namespace's pods with their status, a sweep with its trials)
MAX_BODY_BYTES = 64 * 1024 * 1024


class UnsupportedKubeconfig(Exception):
    """The kubeconfig authenticates some other way (an exec plugin, an auth provider)."""


class ApiReadError(Exception):
    """The API server answered with an error other than 404, or could not be reached."""


class ApiReader:
    """GETs against the current context of one kubeconfig; one kept-alive connection per thread."""

    def __init__(self, kubeconfig: Path) -> None:
        """Reads the kubeconfig once: one rewritten later is not seen (the test clusters keep theirs).
        Raises UnsupportedKubeconfig for any it cannot use, naming the file and why."""
        try:
            self._configure(kubeconfig)
        except (KeyError, TypeError, AttributeError, ValueError, OSError, yaml.YAMLError) as exc:
            raise UnsupportedKubeconfig(f"{kubeconfig}: {exc!r}") from exc
        self._local = threading.local()

    def _configure(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        context = _named(config, "contexts", config.get("current-context"))["context"]
        cluster = _named(config, "clusters", context["cluster"])["cluster"]
        user = _named(config, "users", context["user"])["user"] or {}
        server = urllib.parse.urlsplit(cluster["server"])
        if server.scheme != "https" or not server.hostname:
            raise UnsupportedKubeconfig(f"server {cluster['server']!r} is not an https URL")
        for setting in ("insecure-skip-tls-verify", "tls-server-name", "proxy-url"):  # kubectl honours them; not here
            if cluster.get(setting):
                raise UnsupportedKubeconfig(f"cluster {context['cluster']!r} sets {setting}")
        self.host, self.port, self.prefix = server.hostname, server.port or 443, server.path.rstrip("/")
        self.headers = {"Accept": "application/json"}
        # ssl reads certificates and keys from files only: embedded ones are written to a private folder,
        # loaded, and removed with it before this returns. Named files are relative to the kubeconfig, as
        # for kubectl.
        with tempfile.TemporaryDirectory(prefix="apiread-") as folder:
            files, base = Path(folder), kubeconfig.parent
            self.context = ssl.create_default_context(cafile=_pem(cluster, "certificate-authority", files / "ca", base))
            if "token" in user:
                self.headers["Authorization"] = f"Bearer {user['token']}"
            elif {"client-certificate", "client-certificate-data"} & user.keys():
                certificate = _pem(user, "client-certificate", files / "crt", base)
                assert certificate is not None  # one of the two keys is there
                self.context.load_cert_chain(certificate, _pem(user, "client-key", files / "key", base))
            else:
                raise UnsupportedKubeconfig(f"user {context['user']!r} has neither a client certificate nor a token")

    def get(self, path: str) -> Any:
        """The JSON at `path` (such as /api/v1/namespaces/x/pods), or None when it does not exist (404)."""
        for attempt in (1, 2):  # a kept-alive connection the server has closed since: once more, anew
            connection = self._connection()
            try:
                connection.request("GET", self.prefix + path, headers=self.headers)
                response = connection.getresponse()
                body = response.read(MAX_BODY_BYTES + 1)
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                self._local.connection = None
                if attempt == 2:
                    raise ApiReadError(f"GET {path}: {exc!r}") from exc
                continue
            if len(body) > MAX_BODY_BYTES:
                connection.close()  # the rest of the answer is unread: this connection cannot ask again
                self._local.connection = None
                raise ApiReadError(f"GET {path}: the answer is over {MAX_BODY_BYTES} bytes")
            if response.status == 404:
                return None
            if response.status != 200:
                raise ApiReadError(f"GET {path}: {response.status} {body[:500].decode(errors='replace')}")
            try:
                return json.loads(body)
            except ValueError as exc:
                raise ApiReadError(f"GET {path}: not JSON ({exc})") from exc
        raise AssertionError("unreachable")

    def _connection(self) -> http.client.HTTPSConnection:
        connection: http.client.HTTPSConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=60)
            self._local.connection = connection
        return connection


def _named(config: dict[str, Any], section: str, name: str | None) -> dict[str, Any]:
    found: list[dict[str, Any]] = [entry for entry in config.get(section) or [] if entry.get("name") == name]
    if not found:
        raise UnsupportedKubeconfig(f"no {section} entry named {name!r}")
    return found[0]


def _pem(section: dict[str, Any], key: str, embedded_to: Path, base: Path) -> str | None:
    """The path of a certificate or key the kubeconfig names (relative to `base`), or of the file its
    embedded copy is written to (mode 0600, in the caller's private folder)."""
    if f"{key}-data" in section:
        embedded_to.touch(mode=0o600)
        embedded_to.write_bytes(base64.b64decode(section[f"{key}-data"]))
        return str(embedded_to)
    named = section.get(key)
    return str(base / Path(named).expanduser()) if named else None
