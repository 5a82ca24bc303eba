"""A real Prometheus (Debian's package) and a DCGM-format test exporter, both on loopback.

`DcgmExporter` serves what NVIDIA's dcgm-exporter serves for a T4 that a pod uses — the same metric
names, types and labels (gpu, UUID, device, modelName, Hostname, container, namespace, pod) — with
values from a known pattern, so tests can check the figures computed from them: utilisation steps
between 40 and 90 % (SM activity 0.8 and tensor activity 0.3 of it), 2048 MiB used, 60 W, and an
energy counter rising 60 000 mJ per second.
`Prometheus` scrapes the exporter and any file-discovered targets (the local TorchServe, the stand-in kubelets'
cAdvisor) every second.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection
from pathlib import Path
from typing import Any

from clusterenv.controlplane import ProcessGroup
from clusterenv.textendpoint import TextEndpoint
from servinglab.servers.process import free_ports

UTIL_LOW, UTIL_HIGH = 40.0, 90.0
FB_USED_MIB = 2048.0
POWER_WATTS = 60.0
SM_PER_UTIL, TENSOR_PER_UTIL = 0.8, 0.3  # SM / tensor activity as a share of the utilisation


class DcgmExporter:
    def __init__(self) -> None:
        self.pods: list[tuple[str, str]] = []  # (namespace, pod) using the GPU
        self._started = time.time()
        self._endpoint = TextEndpoint(self.render, "dcgm-exporter")
        self.port = self._endpoint.port

    def start(self) -> DcgmExporter:
        self._endpoint.start()
        return self

    def stop(self) -> None:
        self._endpoint.stop()

    def render(self) -> str:
        elapsed = time.time() - self._started
        util = UTIL_HIGH if int(elapsed) % 2 else UTIL_LOW
        energy = elapsed * POWER_WATTS * 1000.0
        lines = []
        for name, kind, value in (
            ("DCGM_FI_DEV_GPU_UTIL", "gauge", util),
            ("DCGM_FI_DEV_FB_USED", "gauge", FB_USED_MIB),
            ("DCGM_FI_DEV_POWER_USAGE", "gauge", POWER_WATTS),
            ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", energy),
            # profiling counters (SM_ACTIVE is opt-in in dcgm-exporter's CSV): ratios 0..1
            ("DCGM_FI_PROF_SM_ACTIVE", "gauge", util / 100.0 * SM_PER_UTIL),
            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", util / 100.0 * TENSOR_PER_UTIL),
        ):
            lines += [f"# HELP {name} test", f"# TYPE {name} {kind}"]
            for namespace, pod in self.pods or [("", "")]:
                labels = (
                    'gpu="0",UUID="GPU-00000000-0000-0000-0000-000000000000",pci_bus_id="00000000:00:1E.0",'
                    'device="nvidia0",modelName="Tesla T4",Hostname="gpu-t4-0",'
                    f'container="torchserve",namespace="{namespace}",pod="{pod}"'
                )
                lines.append(f"{name}{{{labels}}} {value}")
        return "\n".join(lines) + "\n"


class PromQLError(RuntimeError):
    """Prometheus refused a query (the message is Prometheus' own)."""


class Prometheus:
    def __init__(self, workdir: Path, exporter_port: int) -> None:
        self.workdir = workdir
        self.group = ProcessGroup(workdir)
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets = workdir / "targets.json"
        self.targets.write_text("[]")
        self.kubelets = workdir / "kubelets.json"
        self.kubelets.write_text("[]")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "dcgm", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
                 "honor_labels": True},
                {"job_name": "torchserve", "file_sd_configs": [{"files": [str(self.targets)],
                                                                "refresh_interval": "1s"}]},
                # the stand-in kubelets' cAdvisor (clusterenv.cadvisor), labelled by pod as a kubelet's is
                {"job_name": "cadvisor", "metrics_path": "/metrics/cadvisor", "honor_labels": True,
                 "file_sd_configs": [{"files": [str(self.kubelets)], "refresh_interval": "1s"}]},
            ],
        }  # fmt: skip
        (workdir / "prometheus.yml").write_text(json.dumps(config))

    def start(self, timeout: float = 60.0) -> Prometheus:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed (apt-get install prometheus)")
        process = self.group.start("prometheus", [
            binary, f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}",
        ])  # fmt: skip

        def ready() -> bool:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)

        self.group.wait_until(process, ready, timeout, "/-/ready")
        return self

    def scrape(self, target: str, labels: dict[str, str]) -> None:
        """Add a scrape target (host:port) through file discovery."""
        _add(self.targets, {"targets": [target], "labels": labels})

    def scrape_kubelet(self, target: str) -> None:
        """Add a stand-in kubelet's cAdvisor (host:port) through file discovery."""
        _add(self.kubelets, {"targets": [target]})

    def forget(self, targets: Collection[str]) -> None:
        """Stop scraping `targets` (host:port), added by `scrape` or `scrape_kubelet`: once their test has ended,
        another process may listen on one of those ports."""
        for path in (self.targets, self.kubelets):
            kept = [group for group in json.loads(path.read_text()) if not set(group["targets"]) & set(targets)]
            _replace(path, kept)

    def scraped(self) -> set[str]:
        """The addresses (host:port) of the targets Prometheus scrapes now."""
        return {target["labels"]["instance"] for target in self._api("targets", {"state": "active"})["activeTargets"]}

    def query(self, expression: str, at: float | None = None) -> list[dict[str, object]]:
        """Evaluate an instant query (now, or at the Unix time `at`); a bad expression raises
        PromQLError with Prometheus' message."""
        params = {"query": expression, **({"time": f"{at:.3f}"} if at is not None else {})}
        result: list[dict[str, object]] = self._api("query", params)["result"]
        return result

    def series(self, match: str) -> list[dict[str, str]]:
        """Label sets of the series a selector matches (what Grafana's label_values() reads)."""
        result: list[dict[str, str]] = self._api("series", {"match[]": match})
        return result

    def _api(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())["data"]
        except urllib.error.HTTPError as exc:
            raise PromQLError(f"{params}: {json.loads(exc.read()).get('error')}") from None

    def stop(self) -> None:
        self.group.stop()


def _add(path: Path, group: dict[str, Any]) -> None:
    """One target group more in a file-discovery list."""
    _replace(path, [*json.loads(path.read_text()), group])


def _replace(path: Path, groups: list[dict[str, Any]]) -> None:
    """Write a file-discovery list whole (Prometheus reads it every second, so never half-written)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(groups))
    os.replace(partial, path)


# Grafana's built-in variables, as a 1 s scrape interval and a short run make them.
GRAFANA_BUILTINS = {"$__rate_interval": "15s", "$__interval": "5s", "$__range": "60s"}


def grafana_expression(expression: str) -> str:
    """The query Grafana sends with every template variable set to All (its allValue `.*`)."""
    for builtin, value in GRAFANA_BUILTINS.items():
        expression = expression.replace(builtin, value)
    return re.sub(r"\$\{?(\w+)\}?", ".*", expression)


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of a Grafana dashboard."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]
