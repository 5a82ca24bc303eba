"""Local server processes that never outlive the command that started them.

A local server holds GPU memory: TorchServe (a launcher, a JVM and Python workers), the raw-ceiling
probe, LitServe and Triton. Stopping it in a `finally` is not enough — a SIGKILLed
`servinglab run` runs no `finally` — and a parent-death signal reaches only a direct child, not a
launcher's JVM or its workers. So :func:`spawn` puts a watchdog between this process and the server::

    this process ==pipe (only we hold the write end)==> watchdog --starts--> server, its own process group

The watchdog is this module run as a program (``python -m servinglab.lifeline GRACE -- COMMAND...``,
in a session of its own, so a terminal's Ctrl-C reaches only this process, which stops the server in
order). It starts the command in a new session and waits. When the pipe closes — :meth:`Guarded.stop`
closed it, or this process ended in any way and the kernel closed its descriptors — it sends SIGTERM
to the server's whole process group, SIGKILL after the grace period, and exits. When the server ends
first, the watchdog ends whatever is left of its group and exits with the server's own status, so
:attr:`Guarded.process` reads like the server. Being the server's parent, it keeps the group's id from
being reused while it signals the group; being a child subreaper, it inherits (reaps, and ends) the
server's orphaned descendants, even one that left the group.

Both ends of the pipe are close-on-exec, so no other child of this process holds the write end open
(multiprocessing's generator processes are started by exec too). What this cannot cover: SIGKILL to the
watchdog itself. Only the standard library, so the watchdog starts in milliseconds. Used by
:func:`servinglab.servers.process.start_guarded` (every local server) and :mod:`servinglab.measure.raw.probe`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

#: How often the watchdog checks whether the server ended on its own (the pipe closing wakes it at once).
_POLL_SECONDS = 0.2
#: How long the watchdog waits for the group to go after SIGKILL (a process in a driver call may take a moment).
_KILL_WAIT_SECONDS = 10.0
#: The watchdog's exit status when the command could not be started (as a shell reports it).
CANNOT_START = 127

_File = int | IO[Any] | None


@dataclass
class Guarded:
    """A server's process group tied to this process's life. `process` is the watchdog: its pid, `poll()`
    and `returncode` are what callers watch; its exit status is the server's (killed by a signal: the
    same negative code)."""

    process: subprocess.Popen[bytes]
    grace_seconds: float
    _lifeline: int | None

    def release(self) -> None:
        """Close the pipe: the watchdog ends the server's group (SIGTERM, SIGKILL after the grace period)."""
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status once the watchdog has ended, or None when `timeout` passed first. Polled: under
        gevent (the local runner), Popen.wait can miss a child that ended just before it was called."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (status := self.process.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
        return status

    def stop(self) -> int | None:
        """End the server's group and wait for the watchdog; idempotent. The exit status, or None when the
        watchdog did not finish in time (it is killed then; the caller may still find and kill survivors)."""
        self.release()
        status = self.wait(self.grace_seconds + _KILL_WAIT_SECONDS + 5)
        if status is None:
            self.process.kill()
            self.wait(5)
        return status


def spawn(
    command: Sequence[str],
    *,
    grace_seconds: float,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    stdout: _File = None,
    stderr: _File = None,
) -> Guarded:
    """Start `command` (stdin: /dev/null; stdout, stderr, cwd and env as given) under a watchdog that ends
    its whole process group when this process closes the lifeline or dies. A missing executable raises
    FileNotFoundError here, as subprocess.Popen would."""
    if not command:
        raise ValueError("spawn needs a command")
    search = (env if env is not None else os.environ).get("PATH")
    executable = command[0] if os.sep in command[0] else shutil.which(command[0], path=search)
    if executable is None or not os.access(executable, os.X_OK):
        raise FileNotFoundError(errno.ENOENT, f"{command[0]} not found or not executable", command[0])
    read_end, write_end = os.pipe()  # close-on-exec (PEP 446): only the watchdog gets the read end, as stdin
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "servinglab.lifeline", f"{grace_seconds:g}", "--", executable, *command[1:]],
            stdin=read_end,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return Guarded(process, grace_seconds, write_end)


# -- the watchdog ---------------------------------------------------------------------------------------

_PR_SET_CHILD_SUBREAPER = 36


class _Terminated(Exception):
    """SIGTERM reached the watchdog: end the server as if the pipe had closed."""


def _terminated(signum: int, frame: object) -> NoReturn:
    raise _Terminated


def _become_subreaper() -> None:
    """Orphaned descendants of the server come to the watchdog instead of PID 1: it reaps them at once (a
    zombie still counts as a member of its process group, and a container's PID 1 may never reap it), and
    finds those that left the group. Linux; elsewhere the group alone is ended."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (its pid, the group's id, stays reserved)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _reap(server: subprocess.Popen[bytes]) -> None:
    """Reap every child that ended: orphaned descendants, and the server itself (its status is kept)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == server.pid:
            server.returncode = os.waitstatus_to_exitcode(status)


def _orphans(server_pid: int) -> list[int]:
    """Our children other than the server: its descendants that were orphaned (we are their subreaper)."""
    me, found = os.getpid(), []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == server_pid:
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(entry.path, "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                    found.append(int(entry.name))
    return found


def _alive(server: subprocess.Popen[bytes]) -> list[int]:
    """What is left of the server: its group's id while any member lives, and orphaned descendants."""
    _reap(server)
    left = _orphans(server.pid)
    try:
        os.killpg(server.pid, 0)
        return [-server.pid, *left]
    except ProcessLookupError:
        return left
    except PermissionError:  # a member that changed its user: it is there, and not ours to signal
        return left


def end_group(server: subprocess.Popen[bytes], grace_seconds: float) -> None:
    """SIGTERM to the server's process group and its orphaned descendants, SIGKILL to what is left after
    `grace_seconds`."""
    for signum, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, _KILL_WAIT_SECONDS)):
        targets = _alive(server)
        if not targets:
            return
        for target in targets:  # -pgid: the group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signum)
        deadline = time.monotonic() + wait
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.05)


def _exit_like(returncode: int) -> NoReturn:
    """Exit with the server's status; killed by a signal, die of the same signal (no core file)."""
    if returncode >= 0:
        sys.exit(returncode)
    signum = -returncode
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP take no handler: already default
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    sys.exit(128 + signum)  # a signal whose default action does not end a process


def watch(grace_seconds: float, command: list[str]) -> NoReturn:
    """The watchdog's life: start `command`, wait for the lifeline (stdin) to close or the command to end,
    end the command's group, exit like the command."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminated)
    _become_subreaper()
    try:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        print(f"servinglab lifeline: cannot start {command[0]}: {exc}", file=sys.stderr)
        sys.exit(CANNOT_START)
    try:
        while server.returncode is None and not _exited(server.pid):
            readable, _, _ = select.select([0], [], [], _POLL_SECONDS)
            if readable and not os.read(0, 4096):
                break  # end of file: the process that started us released the server, or is gone
            _reap(server)
    except _Terminated:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
    end_group(server, grace_seconds)
    _exit_like(server.wait())


def main(argv: list[str]) -> NoReturn:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m servinglab.lifeline GRACE_SECONDS -- COMMAND [ARG...]", file=sys.stderr)
        sys.exit(2)
    watch(float(argv[0]), argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
