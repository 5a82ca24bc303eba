"""The load generators' wire: how the coordinator and its generators authenticate and frame messages.

The threat it answers. With `load.generators` > 1 on a cluster, load pod 0 listens on a TCP port
(7100) and the other load pods join it; locally, generator processes talk to the runner over a
socket pair. Anyone who can reach that port may connect: a port scanner, another tenant's pod, a
user with `view` on the namespace who read the experiment. Such a peer must not be able to run code
in the coordinator (it could then forge the results the load ServiceAccount writes), must not inject
or alter samples, and must not stall the coordinator. So:

- Nothing is ever unpickled: messages are JSON objects (bytes as base64), decoded only after their
  frame's MAC checked out; :mod:`servinglab.loadgen.messages` turns them into typed values and
  refuses anything it does not know.
- The key is 32 random bytes per experiment (a Secret given only to its load pods, read from
  SERVINGLAB_GENERATOR_KEY), or per local run (a fresh key the runner hands to its processes).
- Mutual challenge-response on HMAC-SHA256: the coordinator sends a fresh challenge, the generator
  answers it with its own challenge and its proof, the coordinator proves itself on the generator's
  challenge. Neither side learns anything from a peer without the key; each proof binds both
  challenges, so none can be replayed. The handshake's messages have fixed sizes and are compared,
  never parsed.
- Every frame after it carries an HMAC-SHA256 under a per-connection, per-direction key derived
  from both challenges, over an implicit sequence number: frames cannot be forged, replayed,
  reordered, dropped or reflected without the receiver noticing.
- Every size is bounded before anything is allocated: a frame's length prefix above
  MAX_FRAME_BYTES, or a message above MAX_MESSAGE_BYTES (or of more frames than that needs), is
  refused.
- The handshake has a deadline from the first byte (the caller runs each in its own greenlet), so a
  silent or slow client is dropped after HANDSHAKE_SECONDS and never blocks anyone else. After it, a
  receive may have a deadline too (DeadlinePassed): the coordinator knows when each answer is due.

Frame: u32 length (big-endian) of what follows | flags (1 byte: 1 = a message's last frame) |
chunk | HMAC-SHA256(direction key, u64 sequence | flags | chunk). A message is the JSON (UTF-8) of
one object, in one or more frames. Pure standard library (no gevent): it works on any socket, and
under gevent's patched sockets every wait is cooperative.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import socket
import struct
import time
from typing import Any

#: The environment variable the load pods read their key from (hex, KEY_BYTES bytes).
KEY_ENV = "SERVINGLAB_GENERATOR_KEY"
KEY_BYTES = 32
#: Protocol name and version, first on the wire from the coordinator and echoed by the generator.
MAGIC = b"SLGEN/01"
_NONCE_BYTES = 32
_MAC_BYTES = 32
#: What a coordinator sends in place of its proof when the generator's proof was wrong: the generator
#: then knows its key is not the coordinator's (this says nothing an attacker could use).
_REFUSED = b"\x00" * _MAC_BYTES
#: A handshake must complete within this long from the connection's first byte.
HANDSHAKE_SECONDS = 5.0
#: A frame's chunk is at most this long; messages are split into frames of it.
MAX_FRAME_BYTES = 4 << 20
#: A whole message (JSON) is at most this long: the largest is one request body (64 MiB, see
#: payloads.MAX_BODY_BYTES) in base64; samples and payloads travel in batches well below it.
MAX_MESSAGE_BYTES = 96 << 20
#: One decoded frame: a JSON object with a `kind` (:mod:`servinglab.loadgen.messages` reads its fields).
Message = dict[str, Any]
_LENGTH = struct.Struct(">I")
_SEQUENCE = struct.Struct(">Q")
_FINAL = 1


class WireError(ConnectionError):
    """The peer broke the protocol, went silent past a deadline, or closed the connection."""


class AuthenticationFailed(WireError):
    """The peer does not hold the key (or a frame was altered)."""


class DeadlinePassed(WireError):
    """The peer said too little before a deadline (it may be gone without a word: a vanished node)."""


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def key_to_text(key: bytes) -> str:
    return key.hex()


def key_from_text(text: str) -> bytes:
    """The key from its text form (the Secret's value); the message never repeats what it was given."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError(f"{KEY_ENV} is not hexadecimal; expected {2 * KEY_BYTES} hex digits") from None
    if len(key) != KEY_BYTES:
        raise ValueError(f"{KEY_ENV} holds {len(key)} bytes; expected {KEY_BYTES} ({2 * KEY_BYTES} hex digits)")
    return key


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _read_exact(sock: socket.socket, count: int, deadline: float | None, what: str) -> bytes:
    """`count` bytes, or WireError: the peer closed, or `deadline` (monotonic) passed first."""
    buffer = bytearray(count)
    view, got = memoryview(buffer), 0
    if deadline is None:
        sock.settimeout(None)
    while got < count:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlinePassed(f"{what}: {got} of {count} bytes arrived before the deadline")
            sock.settimeout(left)
        try:
            received = sock.recv_into(view[got:])
        except TimeoutError:
            raise DeadlinePassed(f"{what}: {got} of {count} bytes arrived before the deadline") from None
        if received == 0:
            raise WireError(f"{what}: the peer closed the connection after {got} of {count} bytes")
        got += received
    return bytes(buffer)


def _send(sock: socket.socket, data: bytes, deadline: float | None) -> None:
    sock.settimeout(None if deadline is None else max(0.001, deadline - time.monotonic()))
    try:
        sock.sendall(data)
    except TimeoutError:
        raise WireError("the peer did not take the handshake in time") from None


class Channel:
    """One authenticated connection: whole JSON messages in MAC'd frames, in order, both ways."""

    def __init__(self, sock: socket.socket, send_key: bytes, receive_key: bytes) -> None:
        self._sock = sock
        self._send_key, self._receive_key = send_key, receive_key
        self._sent = self._received = 0  # frames so far, each way: the sequence numbers
        self.peer = _address_of(sock)
        sock.settimeout(None)  # after the handshake a message may take as long as a level does

    def send(self, message: Message) -> None:
        try:
            data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
        except ValueError as exc:  # NaN or infinity: JSON has no such numbers
            raise WireError(f"a {message.get('kind')!r} message cannot travel: {exc}") from None
        self._sock.settimeout(None)
        if len(data) > MAX_MESSAGE_BYTES:
            raise WireError(
                f"a {message.get('kind')!r} message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES} bytes "
                "one message may have"
            )
        chunks = [data[start : start + MAX_FRAME_BYTES] for start in range(0, len(data), MAX_FRAME_BYTES)] or [b""]
        for number, chunk in enumerate(chunks):
            flags = bytes([_FINAL if number == len(chunks) - 1 else 0])
            mac = _mac(self._send_key, _SEQUENCE.pack(self._sent), flags, chunk)
            self._sock.sendall(b"".join((_LENGTH.pack(1 + len(chunk) + _MAC_BYTES), flags, chunk, mac)))
            self._sent += 1

    def recv(self, timeout_seconds: float | None = None, *, deadline: float | None = None) -> Message:
        """The next message: a JSON object whose every frame was authenticated, else WireError
        (DeadlinePassed when it is not whole within `timeout_seconds`, or by `deadline`, a monotonic time)."""
        if timeout_seconds is not None:
            deadline = time.monotonic() + timeout_seconds
        parts: list[bytes] = []
        size = 0
        while True:
            (length,) = _LENGTH.unpack(_read_exact(self._sock, _LENGTH.size, deadline, "a frame's length"))
            if not 1 + _MAC_BYTES <= length <= 1 + MAX_FRAME_BYTES + _MAC_BYTES:
                raise WireError(f"refused a frame of {length} bytes (a frame has 33 to {MAX_FRAME_BYTES + 33})")
            if size + length - 1 - _MAC_BYTES > MAX_MESSAGE_BYTES:
                raise WireError(f"refused a message over the {MAX_MESSAGE_BYTES} bytes one message may have")
            if len(parts) >= -(-MAX_MESSAGE_BYTES // MAX_FRAME_BYTES):  # empty frames, on and on
                raise WireError(f"refused a message of more than {len(parts)} frames")
            body = _read_exact(self._sock, length, deadline, "a frame")
            flags, chunk, mac = body[:1], body[1:-_MAC_BYTES], body[-_MAC_BYTES:]
            expected = _mac(self._receive_key, _SEQUENCE.pack(self._received), flags, chunk)
            if not hmac.compare_digest(mac, expected):
                raise AuthenticationFailed(f"frame {self._received} failed authentication (altered or forged)")
            self._received += 1
            if flags[0] & ~_FINAL:
                raise WireError(f"refused a frame with unknown flags {flags[0]:#04x}")
            parts.append(chunk)
            size += len(chunk)
            if flags[0] & _FINAL:
                break
        return _decode(b"".join(parts))

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _address_of(sock: socket.socket) -> str | None:
    """The peer's "host:port" (a load pod's), None on a socket pair (a local process)."""
    try:
        address = sock.getpeername()
    except OSError:
        return None
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: a JSON number, and infinite as a float
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def _decode(data: bytes) -> Message:
    try:
        message = json.loads(data.decode(), parse_constant=_refuse_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"refused a message that is not JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
        raise WireError("refused a message that is not an object with a 'kind'")
    return message


def _session(key: bytes, challenge: bytes, answer: bytes) -> tuple[bytes, bytes]:
    """(coordinator -> generator key, generator -> coordinator key) of one connection."""
    return _mac(key, b"coordinator->generator", challenge, answer), _mac(
        key, b"generator->coordinator", challenge, answer
    )


def accept(sock: socket.socket, key: bytes, seconds: float = HANDSHAKE_SECONDS) -> Channel:
    """The coordinator's side of the handshake on a connection it accepted; AuthenticationFailed if the
    peer does not hold `key`, WireError if it says anything else or too little within `seconds`."""
    deadline = time.monotonic() + seconds
    challenge = secrets.token_bytes(_NONCE_BYTES)
    _send(sock, MAGIC + challenge, deadline)
    reply = _read_exact(sock, len(MAGIC) + _NONCE_BYTES + _MAC_BYTES, deadline, "the generator's answer")
    magic, answer, proof = reply[: len(MAGIC)], reply[len(MAGIC) : -_MAC_BYTES], reply[-_MAC_BYTES:]
    if magic != MAGIC:
        raise WireError("the peer does not speak this protocol (or another version of it)")
    if not hmac.compare_digest(proof, _mac(key, b"generator-proof", challenge, answer)):
        _send(sock, _REFUSED, deadline)
        raise AuthenticationFailed("the peer does not hold this experiment's generator key")
    _send(sock, _mac(key, b"coordinator-proof", challenge, answer), deadline)
    to_generator, to_coordinator = _session(key, challenge, answer)
    return Channel(sock, to_generator, to_coordinator)


def join(sock: socket.socket, key: bytes, seconds: float = HANDSHAKE_SECONDS) -> Channel:
    """The generator's side of the handshake on a connection to the coordinator."""
    deadline = time.monotonic() + seconds
    hello = _read_exact(sock, len(MAGIC) + _NONCE_BYTES, deadline, "the coordinator's challenge")
    if hello[: len(MAGIC)] != MAGIC:
        raise WireError("the peer is not a servinglab load coordinator (or another version of one)")
    challenge, answer = hello[len(MAGIC) :], secrets.token_bytes(_NONCE_BYTES)
    _send(sock, MAGIC + answer + _mac(key, b"generator-proof", challenge, answer), deadline)
    proof = _read_exact(sock, _MAC_BYTES, deadline, "the coordinator's proof")
    if hmac.compare_digest(proof, _REFUSED):
        raise AuthenticationFailed("the coordinator refused this generator's key (the two keys differ)")
    if not hmac.compare_digest(proof, _mac(key, b"coordinator-proof", challenge, answer)):
        raise AuthenticationFailed("the coordinator did not prove it holds the generator key")
    to_generator, to_coordinator = _session(key, challenge, answer)
    return Channel(sock, to_coordinator, to_generator)
