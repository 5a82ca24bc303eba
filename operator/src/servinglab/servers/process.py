"""What every local server process needs from this machine: free loopback ports, and how many GPUs it
may use. Used by the servers' local processes (and by the tests' stand-ins, which need free ports too).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def visible_gpus() -> int:
    """GPUs a local server may use: none unless CUDA_VISIBLE_DEVICES or nvidia-smi says otherwise."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return 0
    return len(result.stdout.split())
