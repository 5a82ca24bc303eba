"""The pinned kubectl against one kubeconfig, and the error every cluster part raises.

Every test part that writes to or reads from the test cluster goes through `Kubectl`: writes and one-off
reads start kubectl; the loops that poll (the stand-in kubelet's pod list, `wait_finished`) call `read`,
which answers in-process where the kubeconfig allows (apiread.py).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clusterenv.apiread import ApiReader, ApiReadError, UnsupportedKubeconfig


class ClusterError(RuntimeError):
    """A component failed to start or answer; the message carries the tail of its log."""


class Kubectl:
    """The pinned kubectl against one kubeconfig; JSON in, JSON out."""

    def __init__(self, binary: Path, kubeconfig: Path, *, in_process_reads: bool = True) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self._reader: ApiReader | None = None
        self._reader_checked = not in_process_reads  # `read` through kubectl only
        self._reader_lock = threading.Lock()

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def get(self, *args: str) -> Any:
        return json.loads(self.run("get", "-o", "json", *args).stdout)

    @property
    def reads_in_process(self) -> bool:
        with self._reader_lock:
            if not self._reader_checked:
                self._reader_checked = True
                try:
                    self._reader = ApiReader(self.kubeconfig)
                except UnsupportedKubeconfig:
                    self._reader = None
        return self._reader is not None

    def read(self, path: str) -> Any:
        """The JSON at an API path (`/api/v1/namespaces/x/pods`), or None when it does not exist: for the
        loops that poll, in-process where the kubeconfig allows (apiread.py), else `kubectl get --raw`."""
        if self.reads_in_process:
            assert self._reader is not None
            try:
                return self._reader.get(path)
            except ApiReadError as exc:
                raise ClusterError(str(exc)) from exc
        found = self.run("get", "--raw", path, check=False)
        if found.returncode != 0:
            if "(NotFound)" in found.stderr:
                return None
            raise ClusterError(f"kubectl get --raw {path} failed: {found.stderr.strip()}")
        return json.loads(found.stdout)

    def apply(self, *objects: dict[str, Any], namespace: str | None = None) -> None:
        document = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        extra = [f"--namespace={namespace}"] if namespace else []
        self.run("apply", *extra, "-f", "-", stdin=json.dumps(document))

    def wait_established(self, crd: str, timeout: float = 60.0) -> None:
        """Until the CRD serves its kind. (`kubectl wait --for=condition=Established` errors out instead
        of waiting when it reads the CRD before the API server has written any condition.)"""

        def established() -> bool:
            found = self.run("get", "crd", crd, "-o", "json", check=False)
            conditions = (
                json.loads(found.stdout).get("status", {}).get("conditions") or [] if found.returncode == 0 else []
            )
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

        self.wait_for(established, timeout, f"CRD {crd} to be established")

    def wait_for(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.3)
        raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
