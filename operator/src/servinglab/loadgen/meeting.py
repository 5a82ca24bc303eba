"""How load pods meet: the first pod accepts the others' connections, each of them joins it.

With `load.generators` > 1 on a cluster, load pod 0 listens (7100) and the other pods of the indexed
load Job connect to it, each proving it holds the experiment's key (:mod:`wire`'s handshake). Anyone who
can reach the port may connect, so no connection may hold up the generators that belong: each handshake
runs in its own greenlet under a deadline from its first byte (a silent, slow or wrong-keyed peer is
dropped and logged), and at most MAX_PENDING_HANDSHAKES run at once — a new connection takes the slot of
the one that has waited longest, which is dropped. A real generator answers its challenge within a round
trip, so connections that say nothing can keep it out no longer than that; the generators retry
(:func:`join_coordinator`) meanwhile. Used by :mod:`servinglab.k8s.loadjob`; what follows the meeting is
:class:`servinglab.loadgen.generators.GeneratorPool`'s.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import gevent
import gevent.event

from servinglab.loadgen import wire
from servinglab.loadgen.generators import GeneratorError

LOG = logging.getLogger(__name__)
#: Handshakes in progress at once: a flood of connections costs the coordinator a bounded number of
#: greenlets and sockets (a new connection beyond them drops the longest-waiting one).
MAX_PENDING_HANDSHAKES = 64


def accept_generators(
    address: tuple[str, int], count: int, key: bytes, timeout_seconds: float,
    handshake_seconds: float = wire.HANDSHAKE_SECONDS, max_pending: int = MAX_PENDING_HANDSHAKES,
) -> list[wire.Channel]:  # fmt: skip
    """Wait for `count` generators to join over TCP (the other pods of an indexed load Job).

    Each connection's handshake runs in its own greenlet under a deadline from its first byte, so a
    silent, slow or wrong-keyed peer is dropped (and logged) without delaying anyone else; with
    `max_pending` handshakes in progress, a new connection takes the longest-waiting one's slot.
    Accepting goes on until `count` generators joined or `timeout_seconds` passed (GeneratorError)."""
    joined: list[wire.Channel] = []
    refused: list[tuple[str, OSError]] = []
    everyone = gevent.event.Event()
    pending: dict[gevent.Greenlet, Any] = {}  # handshakes in progress (their peers), longest-waiting first

    def admit(sock: socket.socket, peer: Any) -> None:
        try:
            channel = wire.accept(sock, key, handshake_seconds)
        except (wire.WireError, OSError) as exc:  # not one of ours: dropped
            LOG.warning("refused a load generator connection from %s: %s", peer, exc)
            refused.append((peer[0], exc))
            sock.close()
            return
        except BaseException:  # killed: its slot was needed, everyone joined, or the time is up
            sock.close()
            raise
        finally:
            pending.pop(gevent.getcurrent(), None)
        if len(joined) == count:  # one too many (a generator that reconnected): not needed
            channel.close()
            return
        joined.append(channel)
        if len(joined) == count:
            everyone.set()

    def accept_all(server: socket.socket) -> None:
        while True:
            sock, peer = server.accept()
            while len(pending) >= max_pending:
                oldest, waiting = next(iter(pending.items()))
                LOG.warning("dropped a load generator connection from %s, the longest waiting of %d handshakes "
                            "in progress, to make room for a new one", waiting, len(pending))  # fmt: skip
                refused.append((waiting[0], wire.DeadlinePassed("dropped unanswered to make room for another")))
                pending.pop(oldest, None)
                oldest.kill()  # waits for it: its socket is closed before the next one is taken
            greenlet = gevent.spawn(admit, sock, peer)
            pending[greenlet] = peer

    with socket.create_server(address) as server:
        acceptor = gevent.spawn(accept_all, server)
        try:
            everyone.wait(timeout_seconds)
        finally:
            acceptor.kill()
            gevent.killall(list(pending))
    if len(joined) < count:
        for channel in joined:
            channel.close()
        # a peer with another key says most (a Secret mix-up); a silent one may be any port scanner
        keyed = [(peer, exc) for peer, exc in refused if isinstance(exc, wire.AuthenticationFailed)]
        example = f", e.g. {(keyed or refused)[-1][0]}: {(keyed or refused)[-1][1]}" if refused else ""
        raise GeneratorError(
            f"{len(joined)} of {count} load generators joined within {timeout_seconds:g} s; "
            f"{len(refused)} connection(s) refused{example}"
        )
    return joined


def join_coordinator(address: tuple[str, int], key: bytes, timeout_seconds: float) -> wire.Channel:
    """Connect to the coordinator (pod 0 of an indexed load Job), retrying while it starts or is busy;
    a coordinator that holds another key ends it at once."""
    deadline = time.monotonic() + timeout_seconds
    where = f"{address[0]}:{address[1]}"
    while True:
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection(address, timeout=10)
            return wire.join(sock, key)
        except wire.AuthenticationFailed as exc:
            if sock is not None:
                sock.close()
            raise GeneratorError(str(exc)) from None
        except OSError as exc:  # not listening yet, or closed a connection it had no room for (WireError)
            if sock is not None:
                sock.close()
            if time.monotonic() > deadline:
                raise GeneratorError(f"cannot join the load coordinator at {where}: {exc}") from None
            time.sleep(1.0)
