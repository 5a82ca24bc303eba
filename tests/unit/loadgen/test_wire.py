"""The load generators' wire (servinglab.loadgen.wire): nothing a peer sends is unpickled, nothing
unauthenticated is decoded, sizes are refused before they are allocated, a peer without the key is
refused both ways, and a silent peer is dropped at the handshake's deadline. Real sockets (socket
pairs) and threads; no gevent here (the coordinator's greenlets are tested in
tests/integration/test_generator_coordination.py)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from servinglab.loadgen import wire
from support.manifests import experiment

KEY = bytes(range(32))


OPEN: list[socket.socket] = []


@pytest.fixture(autouse=True)
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as executor:
        yield executor
    while OPEN:
        OPEN.pop().close()


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair, closed after the test."""
    left, right = socket.socketpair()
    OPEN.extend((left, right))
    return left, right


def pair(pool: ThreadPoolExecutor, generator_key: bytes = KEY) -> tuple[wire.Channel, wire.Channel]:
    """(coordinator, generator) channels over a socket pair, after a real handshake."""
    left, right = socket_pair()
    joined: Future[wire.Channel] = pool.submit(wire.join, right, generator_key)
    return wire.accept(left, KEY), joined.result(timeout=10)


class RunsACommand:
    """What an attacker would send to an unpickling receiver: loading it runs a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def raw_frame(channel: wire.Channel, chunk: bytes, flags: int = 1) -> bytes:
    """A frame exactly as `channel` would send it next (a valid MAC), without sending it."""
    mac = wire._mac(channel._send_key, struct.pack(">Q", channel._sent), bytes([flags]), chunk)
    return struct.pack(">I", 1 + len(chunk) + len(mac)) + bytes([flags]) + chunk + mac


def test_a_pickled_object_that_runs_a_command_is_refused_and_nothing_runs(
    pool: ThreadPoolExecutor, tmp_path: Path
) -> None:
    evil = pickle.dumps(RunsACommand(tmp_path / "ran"))
    # before the handshake: in place of the generator's answer (the old coordinator unpickled right after)
    left, right = socket_pair()
    right.sendall(evil.ljust(72, b"\0"))
    with pytest.raises(wire.WireError, match="does not speak this protocol"):
        wire.accept(left, KEY)
    # after it, even in a correctly authenticated frame: the decoder reads JSON only
    coordinator, generator = pair(pool)
    generator._sock.sendall(raw_frame(generator, evil))
    with pytest.raises(wire.WireError, match="not JSON"):
        coordinator.recv(timeout_seconds=5)
    assert not (tmp_path / "ran").exists()
    pickle.loads(evil)  # the same bytes, unpickled, do run the command: the test would see it
    assert (tmp_path / "ran").exists()


def test_an_oversized_frame_is_refused_from_its_header_before_anything_is_allocated(pool: ThreadPoolExecutor) -> None:
    coordinator, generator = pair(pool)
    for length in (wire.MAX_FRAME_BYTES + 34, 0xFFFF_FFFF):
        generator._sock.sendall(struct.pack(">I", length))  # and nothing after it
        tracemalloc.start()
        try:
            with pytest.raises(wire.WireError, match=f"refused a frame of {length} bytes"):
                coordinator.recv(timeout_seconds=5)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 << 10, peak


def test_a_message_over_its_bound_is_refused_before_its_next_frame_is_read(
    pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "MAX_MESSAGE_BYTES", 1 << 20)
    coordinator, generator = pair(pool)
    with pytest.raises(wire.WireError, match="over the 1048576 bytes"):  # the sender checks too
        generator.send({"kind": "samples", "pad": "x" * (1 << 20)})
    frames = []
    for _ in range(2):  # two non-final frames of 600 kB each: a message that never ends
        frames.append(raw_frame(generator, b"x" * 600_000, flags=0))
        generator._sent += 1
    sending = pool.submit(generator._sock.sendall, b"".join(frames))
    with pytest.raises(wire.WireError, match="over the 1048576 bytes"):
        coordinator.recv(timeout_seconds=5)
    assert not sending.done()  # the second frame was never read
    coordinator.close()
    with pytest.raises(OSError):
        sending.result(timeout=5)


def test_a_message_of_empty_frames_that_never_ends_is_refused(pool: ThreadPoolExecutor) -> None:
    coordinator, generator = pair(pool)
    limit = -(-wire.MAX_MESSAGE_BYTES // wire.MAX_FRAME_BYTES)
    frames = []
    for _ in range(limit + 1):
        frames.append(raw_frame(generator, b"", flags=0))
        generator._sent += 1
    generator._sock.sendall(b"".join(frames))
    with pytest.raises(wire.WireError, match=f"refused a message of more than {limit} frames"):
        coordinator.recv(timeout_seconds=5)


def test_a_frame_altered_replayed_or_reflected_is_refused(pool: ThreadPoolExecutor) -> None:
    for alter in ("mac", "chunk", "replay", "reflect"):
        coordinator, generator = pair(pool)
        frame = bytearray(raw_frame(generator, b'{"kind":"extend","seconds":5}'))
        if alter == "mac":
            frame[-1] ^= 1
        elif alter == "chunk":
            frame[frame.index(b"5")] = ord("9")
        elif alter == "replay":  # delivered once, then again
            generator._sock.sendall(frame)
            assert coordinator.recv(timeout_seconds=5) == {"kind": "extend", "seconds": 5}
        else:  # a coordinator's own frame sent back to it
            frame = bytearray(raw_frame(coordinator, b'{"kind":"stop"}'))
        generator._sock.sendall(frame)
        with pytest.raises(wire.AuthenticationFailed, match="failed authentication"):
            coordinator.recv(timeout_seconds=5)


def test_messages_cross_whole_in_many_frames_and_in_order(pool: ThreadPoolExecutor) -> None:
    coordinator, generator = pair(pool)
    big = {"kind": "payloads", "items": ["x" * (wire.MAX_FRAME_BYTES + 5)]}  # two frames
    sent = pool.submit(lambda: [generator.send(m) for m in ({"kind": "clock", "time": 1.5}, big)])
    assert coordinator.recv(timeout_seconds=10) == {"kind": "clock", "time": 1.5}
    assert coordinator.recv(timeout_seconds=10) == big
    sent.result()
    coordinator.send({"kind": "stop"})
    assert generator.recv(timeout_seconds=5) == {"kind": "stop"}


@pytest.mark.parametrize(
    "text",
    ['{"kind":"extend","seconds":NaN}', '{"kind":"extend","seconds":-1e400}', "[1, 2]", '{"seconds": 1}', "\xff"],
)
def test_a_message_that_is_not_a_json_object_with_a_kind_is_refused(pool: ThreadPoolExecutor, text: str) -> None:
    coordinator, generator = pair(pool)
    generator._sock.sendall(raw_frame(generator, text.encode("latin-1")))
    with pytest.raises(wire.WireError, match="refused a message"):
        coordinator.recv(timeout_seconds=5)


def test_a_generator_with_another_key_is_refused_and_learns_so(pool: ThreadPoolExecutor) -> None:
    spec = json.dumps(experiment("e")).encode()
    for other in (hashlib.sha256(spec).digest(), os.urandom(32), KEY[:-1] + b"\0"):  # the old key, any key
        left, right = socket_pair()
        joined = pool.submit(wire.join, right, other)
        with pytest.raises(wire.AuthenticationFailed, match="does not hold"):
            wire.accept(left, KEY)
        with pytest.raises(wire.AuthenticationFailed, match="refused this generator's key"):
            joined.result(timeout=10)


def test_a_coordinator_without_the_key_is_refused_by_the_generator(pool: ThreadPoolExecutor) -> None:
    left, right = socket_pair()
    joined = pool.submit(wire.join, right, KEY)
    left.sendall(wire.MAGIC + os.urandom(32))  # a challenge anyone can send
    left.recv(72)  # the generator's answer, which proves nothing to a peer without the key
    left.sendall(os.urandom(32))  # a guess at the proof
    with pytest.raises(wire.AuthenticationFailed, match="did not prove"):
        joined.result(timeout=10)


def test_a_silent_client_fails_its_handshake_at_the_deadline(pool: ThreadPoolExecutor) -> None:
    left, right = socket_pair()
    began = time.monotonic()
    with pytest.raises(wire.WireError, match="0 of 72 bytes arrived before the deadline"):
        wire.accept(left, KEY, seconds=1.0)
    assert time.monotonic() - began < 3
    # a slow client too: one byte every 0.3 s never completes within the deadline as a whole
    left, right = socket_pair()
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.3):
            right.send(b"S")

    trickler = threading.Thread(target=trickle)
    trickler.start()
    began = time.monotonic()
    with pytest.raises(wire.WireError, match=r"[1-9] of 72 bytes arrived before the deadline"):
        wire.accept(left, KEY, seconds=1.0)
    stop.set()
    trickler.join()
    assert time.monotonic() - began < 3


def test_the_key_comes_from_64_hex_digits_and_a_bad_one_is_not_repeated() -> None:
    key = wire.new_key()
    assert len(key) == wire.KEY_BYTES and wire.key_from_text(wire.key_to_text(key) + "\n") == key
    assert wire.new_key() != key
    for bad in ("secret-value-zz", "ab" * 16):
        with pytest.raises(ValueError, match=wire.KEY_ENV) as raised:
            wire.key_from_text(bad)
        assert bad not in str(raised.value)
