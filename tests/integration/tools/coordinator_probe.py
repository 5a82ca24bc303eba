"""Load pod 0's coordination alone, with the deadlines a test sets, so it can meet hand-made peers.

    python coordinator_probe.py PORT GENERATORS [--join-timeout S] [--handshake-seconds S] [--max-pending N]
                                [--level USERS] [--reply-margin S]

The key is read from SERVINGLAB_GENERATOR_KEY, as a load pod does. Waits for GENERATORS generators to
join on 127.0.0.1:PORT and prints {"joined": N} (or {"error": ...}); with --level, then runs one
closed-loop level of USERS split between them (1 s warm-up, 1 s measured, against nothing: only the
generators would send) and prints {"level": requests} or {"error": ...}.
"""

from __future__ import annotations

from locust import events  # noqa: F401  - gevent monkey-patching first, as servinglab.entry does

import argparse
import json
import os

from servinglab.loadgen import closed_loop, generators, meeting, wire
from servinglab.loadgen.payloads import Payload


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("generators", type=int)
    parser.add_argument("--join-timeout", type=float, default=60)
    parser.add_argument("--handshake-seconds", type=float, default=wire.HANDSHAKE_SECONDS)
    parser.add_argument("--max-pending", type=int, default=meeting.MAX_PENDING_HANDSHAKES)
    parser.add_argument("--level", type=int)
    parser.add_argument("--reply-margin", type=float, default=generators.REPLY_MARGIN_SECONDS)
    args = parser.parse_args()
    key = wire.key_from_text(os.environ[wire.KEY_ENV])
    try:
        joined = meeting.accept_generators(
            ("127.0.0.1", args.port), args.generators, key, args.join_timeout,
            handshake_seconds=args.handshake_seconds, max_pending=args.max_pending,
        )  # fmt: skip
    except generators.GeneratorError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return
    print(json.dumps({"joined": len(joined)}), flush=True)
    if args.level is None:
        for channel in joined:
            channel.close()
        return
    plan = closed_loop.LoadPlan(
        target="http://127.0.0.1:9", path="/predict", payloads=[Payload(b"x", "application/octet-stream")],
        request_timeout_seconds=1.0,
    )  # fmt: skip
    try:
        with generators.GeneratorPool(plan, local=0, remote=joined, reply_margin_seconds=args.reply_margin) as pool:
            stats = pool.run_level(args.level, 0, 1.0, 1.0)
    except generators.GeneratorError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return
    print(json.dumps({"level": stats.requests}), flush=True)


if __name__ == "__main__":
    main()
