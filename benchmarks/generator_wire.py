"""What the generators' wire costs on a realistic level: encoding, MAC'ing, sending, checking and
decoding one generator's samples (servinglab.loadgen.messages over wire.Channel), next to what the
old wire (pickle over multiprocessing.connection) cost for the same samples.

    .venv/bin/python benchmarks/generator_wire.py [--samples 200000] [--rounds 5]

Samples like a real level's: epoch send times, log-normal latencies, 1 % errors of three kinds. The
codec alone (messages kept in a list), then both ends of the wire in this process on a socket pair (a
thread sending while the main thread receives; the sender's time is encoding, MACs and sending,
which waits on the receiver); the median of `rounds` runs (seconds, and bytes on the wire).
"""

from __future__ import annotations

import argparse
import pickle
import random
import socket
import statistics
import threading
import time
from multiprocessing import Pipe

from servinglab.loadgen import messages, wire
from servinglab.loadgen.stats import Sample


def level_samples(count: int) -> list[Sample]:
    rng = random.Random(1)
    kinds = ["timeout", "http_503", "connection:ConnectionResetError"]
    return [Sample(1.8e9 + i / 5000 + rng.random() / 1000, rng.lognormvariate(3, 0.6),
                   rng.choice(kinds) if rng.random() < 0.01 else None) for i in range(count)]  # fmt: skip


class Counting:
    """A socket that counts the bytes it sends."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.sent = sock, 0

    def sendall(self, data: bytes) -> None:
        self.sent += len(data)
        self.sock.sendall(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def new_wire(samples: list[Sample]) -> dict[str, float]:
    left, right = socket.socketpair()
    key = wire.new_key()
    joined: dict[str, wire.Channel] = {}
    thread = threading.Thread(target=lambda: joined.update(channel=wire.join(right, key)))
    thread.start()
    receiver = wire.accept(left, key)
    thread.join()
    sender = joined["channel"]
    counting = Counting(right)
    sender._sock = counting  # type: ignore[assignment]
    began = time.perf_counter()
    encode = 0.0

    def send() -> None:
        nonlocal encode
        start = time.perf_counter()
        messages.send_samples(sender, samples)
        encode = time.perf_counter() - start

    thread = threading.Thread(target=send)
    thread.start()
    received = messages.receive_samples(receiver)
    total = time.perf_counter() - began
    thread.join()
    assert received == samples
    left.close()
    right.close()
    return {"total": total, "send": encode, "bytes": counting.sent}


class Memory:
    """A channel that keeps messages in a list: the codec's own cost, without JSON, MACs or sockets."""

    def __init__(self) -> None:
        self.messages: list[dict[str, object]] = []

    def send(self, message: dict[str, object]) -> None:
        self.messages.append(message)

    def recv(self) -> dict[str, object]:
        return self.messages.pop(0)


def codec_only(samples: list[Sample]) -> dict[str, float]:
    channel = Memory()
    began = time.perf_counter()
    messages.send_samples(channel, samples)  # type: ignore[arg-type]
    encoded = time.perf_counter()
    received = messages.receive_samples(channel)  # type: ignore[arg-type]
    decoded = time.perf_counter()
    assert received == samples
    return {"total": decoded - began, "send": encoded - began, "bytes": 0}


def old_wire(samples: list[Sample]) -> dict[str, float]:
    parent, child = Pipe()
    began = time.perf_counter()
    size = len(pickle.dumps(("samples", samples)))
    thread = threading.Thread(target=lambda: child.send(("samples", samples)))
    thread.start()
    _, received = parent.recv()
    total = time.perf_counter() - began
    thread.join()
    assert received == samples
    return {"total": total, "send": 0.0, "bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    samples = level_samples(args.samples)
    runners = (("codec alone (now)", codec_only), ("JSON frames + HMAC (now)", new_wire), ("pickle (before)", old_wire))
    for name, run in runners:
        runs = [run(samples) for _ in range(args.rounds)]
        total = statistics.median(r["total"] for r in runs)
        send = statistics.median(r["send"] for r in runs)
        size = runs[0]["bytes"]
        print(f"{name:26s} {args.samples} samples: {total:.3f} s in all, {send:.3f} s of it the sender's"
              + (f"; {size / 1e6:.2f} MB on the wire, {size / args.samples:.1f} B/sample" if size else ""))  # fmt: skip


if __name__ == "__main__":
    main()
