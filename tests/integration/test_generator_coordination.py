"""Load generators meeting over TCP as the load Job's pods do: `servinglab loadtest` with
--generators-listen / --generators-join and their key in SERVINGLAB_GENERATOR_KEY, on 127.0.0.1,
against a trivial endpoint. Strangers at the coordinator's port (a client that says nothing, clients
with another key or the old spec-derived one, the old pickle protocol) are refused without holding
up the generator that belongs, and connections that say nothing never keep it out; a pod without the
key, or with another, stops at once saying why; a generator that goes silent after joining ends the level
at its deadline, named."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from multiprocessing.connection import Client
from pathlib import Path

import pytest
import yaml

from servinglab.loadgen import messages, wire
from servinglab.servers.process import free_ports
from support import manifests

TOOLS = Path(__file__).parent / "tools"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """Answers every POST after 10 ms."""
    (port,) = free_ports(1)
    process = subprocess.Popen([sys.executable, str(TOOLS / "trivial_server.py"), str(port), "10"])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(f"{url}/predict", data=b"x"), timeout=2).read()
            break
        except OSError:
            assert time.monotonic() < deadline, "the trivial endpoint did not start"
            time.sleep(0.1)
    yield url
    process.kill()
    process.wait()


def spec_file(tmp_path: Path) -> Path:
    load = {"concurrency": [4], "warmupSeconds": 0.5, "durationSeconds": 2, "generators": 2,
            "payload": {"format": "raw", "imageSize": 8}}  # fmt: skip
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(manifests.experiment("pods", load=load)))
    return path


def load_pod(
    cmd: list[str], tmp_path: Path, url: str, port: int, index: int, key: str | None, ready_timeout: float = 60
) -> subprocess.Popen[str]:
    """One pod of the indexed load Job: its command line, with JOB_COMPLETION_INDEX and the key as the Job sets them."""
    env = {**os.environ, "JOB_COMPLETION_INDEX": str(index)}
    env.pop(wire.KEY_ENV, None)
    if key is not None:
        env[wire.KEY_ENV] = key
    address = f"127.0.0.1:{port}"
    return subprocess.Popen(
        [*cmd, "loadtest", "--target", url, "--model", "tiny", "--spec-file", str(spec_file(tmp_path)),
         "--output", str(tmp_path / f"results-{index}.json"), "--termination-log", str(tmp_path / f"outcome-{index}"),
         "--ready-timeout", str(ready_timeout), "--generators-listen", address, "--generators-join", address],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def refusals_logged(err: str) -> list[str]:
    """The coordinator's log lines for the connections it refused, one per connection."""
    return [line for line in err.splitlines() if "refused a load generator connection from" in line]


def connect_when_listening(port: int, deadline_seconds: float = 60) -> socket.socket:
    deadline = time.monotonic() + deadline_seconds
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            assert time.monotonic() < deadline, "the coordinator never listened"
            time.sleep(0.02)


def test_a_second_generator_joins_past_a_silent_client_and_strangers_with_other_keys(
    servinglab_cmd: list[str], tmp_path: Path, endpoint: str
) -> None:
    (port,) = free_ports(1)
    key = wire.key_to_text(wire.new_key())
    coordinator = load_pod(servinglab_cmd, tmp_path, endpoint, port, 0, key)
    silent = connect_when_listening(port)  # the first connection, and it never says a word
    silent_peer = f"('127.0.0.1', {silent.getsockname()[1]})"
    member = load_pod(servinglab_cmd, tmp_path, endpoint, port, 1, key)  # joins while that one is pending
    refusals: list[str] = []
    old_key = hashlib.sha256(spec_file(tmp_path).read_bytes()).digest()
    for other in (old_key, wire.new_key()):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            with pytest.raises(wire.AuthenticationFailed) as refused:
                wire.join(sock, other)
            refusals.append(str(refused.value))
    with pytest.raises((OSError, EOFError)):  # the old protocol's client (pickle over multiprocessing)
        Client(("127.0.0.1", port), authkey=old_key)
    # (that none of them waits for the silent client's handshake is shown by
    # test_connections_that_say_nothing_never_keep_a_generator_out, with a deadline no host is slow enough to
    # reach; here it is the real 5 s, which a slow host can reach before the strangers are answered)
    # the silent client is shown the door: the challenge, then the end (at its deadline, or once everyone joined)
    silent.settimeout(60)
    with silent:
        received = b""
        while chunk := silent.recv(100):
            received += chunk
    assert received.startswith(wire.MAGIC) and len(received) == len(wire.MAGIC) + 32

    out, err = coordinator.communicate(timeout=300)  # starting the command alone can take a minute on a busy host
    member_out, member_err = member.communicate(timeout=300)
    assert coordinator.returncode == 0, err[-3000:]
    assert member.returncode == 0, member_err[-3000:]
    assert refusals == ["the coordinator refused this generator's key (the two keys differ)"] * 2
    (level,) = json.loads((tmp_path / "results-0.json").read_text())["results"]
    assert level["generator"]["generators"] == 2 and level["errors"] == 0 and level["requests"] > 0
    assert all(g["cpuPercent"] > 0 for g in level["generator"]["perGenerator"]), level["generator"]
    assert (tmp_path / "outcome-1").read_text() == "load generator 2 done"
    # each stranger was logged once with why; the silent one too if its deadline came before the member joined
    # (which a slow host decides), else it was dropped unlogged once everyone had joined
    refused = refusals_logged(err)
    silent_logged = [line for line in refused if silent_peer in line]
    assert len(refused) - len(silent_logged) == 3 and len(silent_logged) <= 1, err
    assert all("arrived before the deadline" in line for line in silent_logged), silent_logged
    assert err.count("does not hold this experiment's generator key") == 2, err
    written = [out, err, member_out, member_err, *(p.read_text() for p in tmp_path.iterdir() if p.is_file())]
    assert not any(key in text or key.upper() in text for text in written)  # the key itself: nowhere


def test_a_generator_with_another_key_stops_at_once_and_the_coordinator_says_why(
    servinglab_cmd: list[str], tmp_path: Path, endpoint: str
) -> None:
    (port,) = free_ports(1)
    # the coordinator waits long enough for the member's command to start, which a busy host can take a minute for
    coordinator = load_pod(servinglab_cmd, tmp_path, endpoint, port, 0, wire.new_key().hex(), ready_timeout=90)
    silent = connect_when_listening(port)
    member = load_pod(servinglab_cmd, tmp_path, endpoint, port, 1, wire.new_key().hex(), ready_timeout=10)
    member.communicate(timeout=300)
    assert member.returncode == 6
    with silent:  # dropped at its handshake's deadline, while the coordinator still waits for a generator
        silent.settimeout(60)
        assert silent.recv(100).startswith(wire.MAGIC) and silent.recv(100) == b""
    assert (tmp_path / "outcome-1").read_text() == (
        f"load generator for 127.0.0.1:{port}: the coordinator refused this generator's key (the two keys differ)"
    )
    _, err = coordinator.communicate(timeout=300)
    assert coordinator.returncode == 6
    assert "the generator's answer: 0 of 72 bytes arrived before the deadline" in err, err
    # the member stopped at its first refusal: one try, not its 10 + 120 s of retries
    keyed = [line for line in refusals_logged(err) if "does not hold this experiment's generator key" in line]
    assert len(keyed) == 1, err
    outcome = (tmp_path / "outcome-0").read_text()
    assert outcome == (
        "0 of 1 load generators joined within 90 s; 2 connection(s) refused, "
        "e.g. 127.0.0.1: the peer does not hold this experiment's generator key"
    )


@pytest.mark.parametrize("key", [None, "not-hex-but-a-secret", "ab" * 31])
def test_a_pod_of_several_generators_without_a_usable_key_fails_at_once(
    servinglab_cmd: list[str], tmp_path: Path, endpoint: str, key: str | None
) -> None:
    (port,) = free_ports(1)
    for index in (0, 1):
        pod = load_pod(servinglab_cmd, tmp_path, endpoint, port, index, key)
        pod.communicate(timeout=300)  # starting the command alone can take a minute on a busy host
        outcome = (tmp_path / f"outcome-{index}").read_text()
        assert pod.returncode == 6 and wire.KEY_ENV in outcome, outcome
        assert not key or key not in outcome
    with pytest.raises(OSError):  # nobody ever listened
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def coordinator_probe(port: int, generators: int, key: bytes, *options: str) -> subprocess.Popen[str]:
    """Pod 0's coordination alone (tools/coordinator_probe.py), with the deadlines `options` set."""
    return subprocess.Popen(
        [sys.executable, str(TOOLS / "coordinator_probe.py"), str(port), str(generators), *options],
        env={**os.environ, wire.KEY_ENV: wire.key_to_text(key)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def test_connections_that_say_nothing_never_keep_a_generator_out() -> None:
    (port,) = free_ports(1)
    key = wire.new_key()
    # four handshake slots; a silent connection would hold one for five minutes
    probe = coordinator_probe(port, 1, key, "--max-pending", "4", "--handshake-seconds", "300")
    silent = [connect_when_listening(port), *(socket.create_connection(("127.0.0.1", port)) for _ in range(11))]
    for sock in silent:  # each was taken in (its challenge) or turned away (the end) before the generator comes
        sock.settimeout(30)
        sock.recv(len(wire.MAGIC) + 32)
    joined, failures = None, []
    deadline = time.monotonic() + 20  # retrying as join_coordinator does, far inside the silent ones' 300 s
    while joined is None and time.monotonic() < deadline:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            joined = wire.join(sock, key)
        except wire.WireError as exc:
            failures.append(str(exc))
            sock.close()
            time.sleep(1.0)
    try:
        assert joined is not None, failures
        out, err = probe.communicate(timeout=60)
    finally:
        for sock in silent:
            sock.close()
        if joined is not None:
            joined.close()
        if probe.poll() is None:
            probe.kill()
    assert json.loads(out.splitlines()[-1]) == {"joined": 1}, err[-3000:]
    # twelve silent connections and the generator through four slots: the nine longest-waiting were dropped
    assert err.count("dropped a load generator connection from") == 9, err[-3000:]


def test_a_generator_that_goes_silent_after_joining_ends_the_level_naming_it() -> None:
    (port,) = free_ports(1)
    key = wire.new_key()
    probe = coordinator_probe(port, 1, key, "--level", "2", "--reply-margin", "2")
    sock = connect_when_listening(port)
    named = f"load generator 1 of 1 (at 127.0.0.1:{sock.getsockname()[1]})"
    generator = wire.join(sock, key)
    try:
        while (order := generator.recv(timeout_seconds=60))["kind"] != "level":
            if order["kind"] == "clock":
                generator.send(messages.clock(time.time()))
        # its level's order arrived; now it says nothing more and keeps the connection open, as a
        # generator on a node that vanished does
        out, err = probe.communicate(timeout=120)
    finally:
        generator.close()
        if probe.poll() is None:
            probe.kill()
    error = json.loads(out.splitlines()[-1])["error"]
    assert error.startswith(f"{named} did not send its samples (due after "), err[-3000:]
    assert error.endswith(", 1 s measured), nor in 2 s more: the level ends without it (its process, pod or node "
                          "is gone, or it cannot keep up)"), error  # fmt: skip


PLAN_ROUND_TRIP = """
from locust import events  # gevent first, as servinglab.entry does
import dataclasses, socket, threading
from servinglab.loadgen import closed_loop, messages, open_loop, wire
from servinglab.loadgen.payloads import Payload
from servinglab.api import GeneratorLimits, ResponseCheck, StabilitySpec

bodies = [Payload(bytes(range(256)) * 4096 * 20, "application/x-npy"), Payload(b"", "text/plain"),
          *(Payload(bytes([i % 256]) * 1000, f"image/{i}") for i in range(300))]
common = dict(target="http://127.0.0.1:9", path="/predictions/m", payloads=bodies, request_timeout_seconds=7.5,
              check=ResponseCheck(status=201, json=True), payload_offset=3,
              stability=StabilitySpec(window_seconds=2, windows=4, tolerance=0.05, max_duration_seconds=60),
              generator_limits=GeneratorLimits(max_cpu_percent=70, max_send_gap_ms=4, max_send_gap_share=0.2))
plans = [("closed", closed_loop.LoadPlan(**common, locust_stats=True)),
         ("open", open_loop.OpenLoopPlan(**common, arrival="constant", max_in_flight=77, seed=12345))]
left, right = socket.socketpair()
key = wire.new_key()
result = {}
thread = threading.Thread(target=lambda: result.update(channel=wire.join(right, key)))
thread.start()
coordinator = wire.accept(left, key)
thread.join()
generator = result["channel"]
sent = []
for loop, plan in plans:
    batch = messages.plan_messages(loop, plan)
    sent.append(len(batch))
    thread = threading.Thread(target=lambda: [coordinator.send(m) for m in batch])
    thread.start()
    received = messages.read_plan(generator.recv(), generator)
    thread.join()
    assert received[0] == loop, received
    for field in dataclasses.fields(plan):
        if field.name == "timing":  # what a run sets, not what travels
            continue
        assert getattr(received[1], field.name) == getattr(plan, field.name), field.name
print(sent)
"""


def test_a_plan_crosses_the_wire_whole_with_its_request_bodies() -> None:
    run = subprocess.run([sys.executable, "-c", PLAN_ROUND_TRIP], capture_output=True, text=True, timeout=120,
                         check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    # a 20 MiB body and 301 small ones: the header, then bodies in batches under the message bound
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [3, 3]
