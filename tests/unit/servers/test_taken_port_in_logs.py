"""How a local server's exit is read as a port taken before it bound it: the line each server writes (Python's,
Netty's, Triton's), only from what its output gained since this start (it is appended to across restarts),
and only before the server came up (later, those words are not about its ports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servinglab.servers.base import PortTaken, ServerError
from servinglab.servers.process import ServerOutput, log_end, port_taken

SAID = {
    "python": "ERROR:    [Errno 98] Address already in use",
    "netty": "Caused by: io.grpc.netty.shaded.io.netty.channel.unix.Errors$NativeIoException: bind(..) failed: "
    "Address already in use",
    "triton": 'E1129 03:22:28.126395 3825 main.cc:257] "failed to start HTTP service: Unavailable - Socket '
    "'127.0.0.1:26585' already in use \"",
}


@pytest.mark.parametrize("server", sorted(SAID))
def test_each_servers_own_words_for_a_taken_port_are_found(server: str, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(f"starting\n{SAID[server]}\n  at somewhere\nstopped\n")
    assert port_taken(log) == SAID[server].strip()


def test_only_what_the_log_gained_since_this_start_counts(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(f"first start\n{SAID['python']}\n")
    since = log_end(log)
    with open(log, "a") as out:
        out.write("second start\nTraceback: ModuleNotFoundError: no module named 'handler'\n")
    assert port_taken(log) is not None, "the whole log does say it"
    assert port_taken(log, since) is None, "the second start ended for another reason"
    log.write_text("replaced by a shorter one\n")
    assert port_taken(log, since) is None, "a log shorter than the mark has nothing new"


def test_only_the_end_of_a_long_log_is_read(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(f"{SAID['netty']}\n" + ("x" * 80 + "\n") * 4000)  # the taken port, then 324 KB
    assert port_taken(log) is None, "a line that far back is not this exit's"
    with open(log, "a") as out:
        out.write(f"{SAID['triton']}\n")
    assert port_taken(log) == SAID["triton"].strip()


def test_a_missing_log_or_a_plain_failure_is_not_a_taken_port(tmp_path: Path) -> None:
    assert log_end(tmp_path / "none.log") == 0
    assert port_taken(tmp_path / "none.log") is None
    log = tmp_path / "server.log"
    log.write_text("java.lang.OutOfMemoryError: Java heap space\nexited\n")
    assert port_taken(log) is None


def test_the_exit_is_a_taken_port_only_before_the_server_came_up(tmp_path: Path) -> None:
    output = ServerOutput(tmp_path / "server.log")
    output.path.write_text(f"an earlier start\n{SAID['python']}\n")
    output.starting()
    with open(output.path, "a") as out:
        out.write(f"binding\n{SAID['python']}\n")
    taken = output.exit_error("LitServe", 1, output.path, "the tail")
    assert isinstance(taken, PortTaken) and taken.server == "LitServe" and taken.said == SAID["python"]
    assert str(taken).startswith("LitServe exited with code 1: ERROR:    [Errno 98] Address already in use")
    assert "bound by another process" in str(taken) and str(output.path) in str(taken)
    output.up = True  # the model later printed those words, then the server was killed
    crashed = output.exit_error("LitServe", 137, output.path, "Killed")
    assert type(crashed) is ServerError and str(crashed).startswith("LitServe exited with code 137;")
    assert str(crashed).endswith(":\nKilled"), "the exit code and the log's tail are kept"
    output.starting()
    assert type(output.exit_error("LitServe", 1, output.path, "")) is ServerError, "this start said nothing of it"
