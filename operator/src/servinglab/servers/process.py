"""What every local server process needs from this machine: free loopback ports, how many GPUs it may
use, starting it under a watchdog that stops it with everything it started (even when this process is
killed), a server started again on other ports when one picked for it was taken, and one request to it.
Used by the servers' local processes and the local runner (and by the tests: their stand-ins need free
ports too, and the tests that start a server themselves meet taken ports as users do).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

from servinglab import lifeline
from servinglab.servers.base import PORT_ATTEMPTS, LocalServer, PortTaken, ServerError

S = TypeVar("S", bound=LocalServer)

#: Where free ports are looked for: below the kernel's ephemeral range, which outgoing connections draw
#: from. A port picked there (bound to 0) can be taken by any client's connection before the server binds
#: it — on a busy machine that happens (a local server or test stand-in failing with "address in use").
_LISTEN_PORTS_FROM = 10_000
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def _ephemeral_low() -> int:
    with contextlib.suppress(OSError, ValueError), open(_EPHEMERAL_RANGE) as handle:
        return int(handle.read().split()[0])
    return 32768  # Linux's default


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1, chosen at random below the kernel's ephemeral range
    (so no outgoing connection takes one before it is bound), each checked by binding it; held open
    together so they differ. Falls back to the kernel's choice when that range is exhausted."""
    picker = random.SystemRandom()
    low, high = _LISTEN_PORTS_FROM, _ephemeral_low()
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            for _attempt in range(64) if high - low > 1000 else ():
                with contextlib.suppress(OSError):
                    sock.bind(("127.0.0.1", picker.randrange(low, high)))
                    break
            else:
                sock.bind(("127.0.0.1", 0))
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


def start_guarded(
    command: list[str], *, log: Path, cwd: Path, env: dict[str, str], grace_seconds: float
) -> lifeline.Guarded:
    """Start a server in its own process group under a watchdog (:mod:`servinglab.lifeline`), its output
    appended to `log`: stopping it ends every process it started, and so does the watchdog when this
    process dies without stopping it (SIGKILL included). The guard's `process` is the watchdog, whose exit
    status is the server's."""
    with open(log, "ab") as out:
        return lifeline.spawn(
            command, grace_seconds=grace_seconds, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def start_ready(
    make: Callable[[], S], timeout_seconds: float, *, taken: PortTaken | None = None,
    retrying: Callable[[PortTaken], None] = lambda taken: None,
) -> tuple[S, float]:  # fmt: skip
    """`make()`'s server, started and ready, and the seconds that took (its cold start). A start that ends
    in :class:`PortTaken` is stopped and `make()` called again, since a new server picks new ports; `retrying`
    hears why before each new start. At most PORT_ATTEMPTS starts, `taken` counting as the first: a start the
    caller saw end so. A port taken at every start raises :class:`ServerError`; any other failure (an
    interrupt too) stops the server and is raised as it came."""
    for _attempt in range(2 if taken else 1, PORT_ATTEMPTS + 1):
        if taken is not None:
            retrying(taken)
        server = make()
        try:
            server.start()
            return server, server.wait_ready(timeout_seconds)
        except PortTaken as exc:
            server.stop()
            taken = exc
        except BaseException:
            server.stop()
            raise
    raise ServerError(f"{taken}; a port was taken at each of {PORT_ATTEMPTS} starts")


def stop_guarded(guard: lifeline.Guarded) -> None:
    """End a guarded server's process group (SIGTERM, SIGKILL after its grace period), then kill any
    descendant that left the group."""
    descendants: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        descendants = psutil.Process(guard.process.pid).children(recursive=True)
    guard.stop()
    for proc in descendants:  # anything that left the group (setsid) still goes
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(descendants, timeout=5)


#: How a server says a port it was to listen on is bound already: Python's "[Errno 98] Address already in
#: use", Netty's "bind(..) failed: Address already in use", Triton's "Socket '127.0.0.1:P' already in use".
_PORT_TAKEN = re.compile(r"address already in use|socket '[^']*' already in use", re.IGNORECASE)
#: The end of a server's log searched for it: the server exits right after saying so.
_PORT_TAKEN_TAIL_BYTES = 256 * 1024


def log_end(log: Path) -> int:
    """Where a server's log ends now (0 while there is none): a start's own output follows it."""
    try:
        return log.stat().st_size
    except OSError:
        return 0


def port_taken(log: Path, since: int = 0) -> str | None:
    """The last line, of what a server's log gained after byte `since` (the start's :func:`log_end`: a log
    is appended to across restarts), that says one of its ports was bound already; None when none does."""
    try:
        with open(log, "rb") as handle:
            handle.seek(max(since, handle.seek(0, os.SEEK_END) - _PORT_TAKEN_TAIL_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    said = [line.strip() for line in text.splitlines() if _PORT_TAKEN.search(line)]
    return said[-1] if said else None


class ServerOutput:
    """A local server's output file across its starts (appended to by each): where the current start's output
    begins, and whether the server has come up since. Read when the server's process has exited, for the
    error to say why: a port it could not bind is said before it comes up, so only then is such a line
    taken for a taken port (a model may print those words later, and a crash is then a crash)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.since = 0
        self.up = False

    def starting(self) -> None:
        """Just before the server's process starts."""
        self.since, self.up = log_end(self.path), False

    def exit_error(self, server: str, code: int | None, logs: Path, tail: str) -> ServerError:
        """:class:`PortTaken` when, before it came up, this start's output said a port was in use; else a
        ServerError with the exit code, where the logs are and their `tail`."""
        if not self.up and (taken := port_taken(self.path, self.since)) is not None:
            return PortTaken(server, code, taken, logs)
        return ServerError(f"{server} exited with code {code}; logs in {logs}:\n{tail}")


def tail_of(log: Path, lines: int = 20) -> str:
    """The last `lines` lines of a server's log ("" while there is none), for an error message."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def descendants_running(process: subprocess.Popen[bytes] | None, marker: str) -> list[int]:
    """The processes under `process` (at any depth) whose command line has a part containing `marker`: a
    server's model workers, whose CPU (used or waited for) is the model's (the verdicts read it)."""
    found: list[int] = []
    if process is None:
        return found
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if any(marker in part for part in child.cmdline()):
                    found.append(child.pid)
    return found


def post(url: str, body: bytes, content_type: str, timeout: float) -> tuple[int, Any]:
    """One request to a local server: (HTTP status, the answer's JSON)."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
