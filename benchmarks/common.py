"""Shared pieces of the benchmarks: a TorchServe and an nginx to measure, servinglab's own load
generator (`servinglab loadtest`, the Kubernetes Job's command) and wrk (Debian) as the independent
reference, with wrk's output parsed.

Benchmarks print figures; they are not tests. Each runs with one command from the repository root
(`.venv/bin/python benchmarks/NAME.py`); docs/benchmarks.md records the latest figures.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from servinglab import servers
from servinglab.api import parse_experiment
from servinglab.loadgen.payloads import CONTENT_TYPES, make_payloads
from servinglab.models.catalogue import request_image_size
from servinglab.servers.process import free_ports
from servinglab.servers.torchserve.local import LocalTorchServe

_BESIDE = Path(sys.executable).with_name("servinglab")
#: the CLI beside this interpreter (a venv), else the one on PATH (a machine set up by hack/device-setup.sh)
SERVINGLAB = str(_BESIDE) if _BESIDE.exists() else (shutil.which("servinglab") or "servinglab")


def experiment(name: str, model: str, server: dict[str, Any], load: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "servinglab.dev/v1alpha1",
        "kind": "ServingExperiment",
        "metadata": {"name": name},
        "spec": {"model": {"name": model}, "server": {"gpus": 0, **server}, "load": load},
    }


@contextmanager
def torchserve(document: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """A local TorchServe for the experiment's model and server settings: (inference URL, model)."""
    parsed = parse_experiment(document)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ts-"))
    archive = servers.get(parsed.spec.server.kind).prepare_model(parsed.spec, workdir).directory
    server = LocalTorchServe(parsed.spec.model.name, archive, parsed.spec.server, workdir)
    try:
        server.start()
        server.wait_ready(600)
        yield server.addresses.inference, server.model_name
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def nginx() -> Iterator[str]:
    """nginx answering 200 "ok" to any request: an endpoint faster than any load generator here."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        raise SystemExit("nginx is needed: apt-get install nginx-light")
    (port,) = free_ports(1)
    root = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    (root / "nginx.conf").write_text(f"""
daemon off; worker_processes 1; pid {root}/nginx.pid; error_log {root}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off; client_body_temp_path {root}; proxy_temp_path {root}; fastcgi_temp_path {root};
  uwsgi_temp_path {root}; scgi_temp_path {root}; keepalive_requests 1000000;
  server {{ listen 127.0.0.1:{port}; location / {{ return 200 "ok"; }} }}
}}
""")
    process = subprocess.Popen([binary, "-c", str(root / "nginx.conf"), "-p", str(root)])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


def kept(level: dict[str, Any]) -> bool:
    """An open-loop level the generator kept: no flag, the offered rate sent, under 1 % late, no errors."""
    sent = level["openLoop"]
    return (
        not level["generator"]["saturated"]
        and sent["sentRps"] >= 0.98 * sent["offeredRps"]
        and sent["lateSends"] <= 0.01 * level["requests"]
        and level["errors"] == 0
    )


def servinglab_loadtest(
    url: str, model: str, document: dict[str, Any], payload_dir: Path | None = None
) -> dict[str, Any]:
    """Run the experiment's load section with `servinglab loadtest`; its results JSON (payload files
    and a trace are read from `payload_dir`)."""
    with tempfile.TemporaryDirectory() as folder:
        spec_file = Path(folder) / "experiment.yaml"
        spec_file.write_text(yaml.safe_dump(document))
        out = Path(folder) / "results.json"
        done = subprocess.run(
            [SERVINGLAB, "loadtest", "--target", url, "--model", model, "--spec-file", str(spec_file),
             "--output", str(out), "--termination-log", str(Path(folder) / "termination-log"),
             *(["--payload-dir", str(payload_dir)] if payload_dir is not None else [])],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"servinglab loadtest failed: {done.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def payload_file(document: dict[str, Any], folder: Path) -> tuple[Path, str]:
    """The experiment's first payload on disk, for wrk's Lua script; (path, content type)."""
    spec = parse_experiment(document).spec
    load = spec.load
    size = request_image_size(spec.model, load.payload)
    body = make_payloads(load.payload.format, size, 1, load.payload.seed)[0]
    path = folder / "payload.bin"
    path.write_bytes(body)
    return path, CONTENT_TYPES[load.payload.format]


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def wrk(url: str, connections: int, seconds: float, body: Path | None = None, content_type: str = "") -> dict[str, Any]:
    """wrk -t1 (one thread, like servinglab's one gevent loop) with --latency; parsed figures."""
    binary = shutil.which("wrk")
    if binary is None:
        raise SystemExit("wrk is needed: apt-get install wrk")
    with tempfile.TemporaryDirectory() as folder:
        command = [binary, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "--timeout", "60s"]
        if body is not None:
            script = Path(folder) / "post.lua"
            script.write_text(
                f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "{content_type}"\n'
                f'local f = io.open("{body}", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
            )
            command += ["-s", str(script)]
        output = subprocess.run([*command, url], capture_output=True, text=True, check=True).stdout
    percentiles = {
        f"p{int(float(p))}": float(value) * _UNITS[unit]
        for p, value, unit in re.findall(r"^\s+(\d+(?:\.\d+)?)%\s+([\d.]+)(us|ms|s)\s*$", output, flags=re.MULTILINE)
    }
    requests = int(re.search(r"(\d+) requests in", output).group(1))  # type: ignore[union-attr]
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", output))
    return {
        "throughputRps": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),  # type: ignore[union-attr]
        "latencyMs": percentiles,
        "requests": requests,
        "errors": errors,
        "raw": output,
    }


def table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table, as pasted into docs/benchmarks.md."""

    def cell(value: Any) -> str:
        return f"{value:.1f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
