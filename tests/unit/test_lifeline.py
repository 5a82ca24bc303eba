"""A server started under a watchdog never outlives the process that started it: real processes, real
signals (`sleep` and `sh` stand in for a launcher and its JVM and workers)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from servinglab import lifeline

#: A launcher with two workers in its process group, like TorchServe's launcher, JVM and Python workers.
LAUNCHER = ["sh", "-c", "sleep 300 & sleep 300 & wait"]


def descendants(pid: int, count: int, timeout: float = 10.0) -> list[psutil.Process]:
    """The first `count` descendants of `pid`, once they all exist."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = psutil.Process(pid).children(recursive=True)
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{pid} did not start {count} processes")


def gone_within(processes: list[psutil.Process], seconds: float) -> float:
    """Seconds until every process has ended (zombies count as ended); fails after `seconds`."""
    started = time.monotonic()
    while True:
        alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return time.monotonic() - started
        if time.monotonic() - started > seconds:
            for proc in alive:  # leave nothing behind for the next test
                proc.kill()
            raise AssertionError(f"still running after {seconds} s: {[p.cmdline() for p in alive]}")
        time.sleep(0.05)


def test_stop_ends_the_whole_process_group_even_while_other_children_live_on() -> None:
    guard = lifeline.spawn(LAUNCHER, grace_seconds=5)
    server = [psutil.Process(guard.process.pid), *descendants(guard.process.pid, 3)]
    # another child of ours, started afterwards, must not hold the lifeline open (close-on-exec)
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        assert guard.stop() == -signal.SIGTERM
        gone_within(server, 2)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize(
    ("script", "status"),
    [("sleep 300 & sleep 1; exit 7", 7), ("sleep 300 & sleep 1; kill -KILL $$", -signal.SIGKILL)],
)
def test_the_servers_own_exit_status_is_reported_and_what_it_left_in_its_group_ends(script: str, status: int) -> None:
    guard = lifeline.spawn(["sh", "-c", script], grace_seconds=5)
    left = descendants(guard.process.pid, 3)  # sh and its two sleeps
    assert guard.process.wait(timeout=10) == status
    gone_within(left, 1)
    assert guard.stop() == status  # idempotent once it ended


PARENT = textwrap.dedent(
    """
    import sys, time
    from servinglab import lifeline
    guard = lifeline.spawn(sys.argv[2:], grace_seconds=float(sys.argv[1]))
    print(guard.process.pid, flush=True)
    time.sleep(600)
    """
)


def killed_parent(command: list[str], grace_seconds: float, servers: int) -> tuple[list[psutil.Process], float]:
    """Start a parent that runs `command` under a watchdog, SIGKILL the parent once the command's
    `servers` processes exist; (the watchdog and those processes, when the parent was killed)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(grace_seconds), *command], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    watchdog = int(parent.stdout.readline())
    processes = [psutil.Process(watchdog), *descendants(watchdog, servers)]
    parent.kill()
    parent.wait()
    return processes, time.monotonic()


def test_a_parent_killed_with_sigkill_takes_the_whole_group_with_it_at_once() -> None:
    processes, _ = killed_parent(LAUNCHER, grace_seconds=30, servers=3)
    # SIGTERM ends sh and sleep at once: nothing waits for the 30 s grace
    assert gone_within(processes, 3) < 3


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    stubborn = ["sh", "-c", "trap '' TERM; sleep 300 & sleep 300 & wait"]  # the sleeps inherit the ignored TERM
    processes, killed = killed_parent(stubborn, grace_seconds=1, servers=3)
    gone_within(processes, 1 + 5)
    assert time.monotonic() - killed >= 1  # SIGTERM first, SIGKILL only once the grace period is over


def test_a_descendant_that_left_the_group_is_ended_too() -> None:
    # `setsid` puts one sleep in a session of its own: no signal to the group reaches it, but once its
    # parent is gone the watchdog inherits it (a child subreaper) and ends it
    escaping = ["sh", "-c", "setsid sleep 300 & sleep 300 & wait"]
    processes, _ = killed_parent(escaping, grace_seconds=0.5, servers=3)
    gone_within(processes, 0.5 + 5)


def test_a_command_that_does_not_exist_is_refused_before_anything_starts() -> None:
    children = {child.pid for child in psutil.Process().children()}
    with pytest.raises(FileNotFoundError, match="no-such-server"):
        lifeline.spawn(["no-such-server", "--port", "1"], grace_seconds=1)
    assert {child.pid for child in psutil.Process().children()} == children
