"""Watch this host's scheduling while a load-generator test runs; print what it saw as JSON.

    python host_stalls.py            (runs until stdin closes)

It sleeps 2 ms at a time and records every oversleep: on a shared machine another process (or the
hypervisor) can hold the CPU for tens or hundreds of milliseconds, and then *any* generator sends
late. The tests use it to tell a generator that cannot keep time from a host that stalled.
"""

from __future__ import annotations

import json
import sys
import threading
import time

TICK_S = 0.002


def main() -> None:
    done = threading.Event()

    def wait_for_stdin_to_close() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_stdin_to_close, daemon=True).start()
    oversleeps_ms: list[float] = []
    while not done.is_set():
        before = time.perf_counter()
        time.sleep(TICK_S)
        oversleeps_ms.append((time.perf_counter() - before - TICK_S) * 1000.0)
    print(json.dumps({"maxMs": round(max(oversleeps_ms, default=0.0), 1),
                      "over10Ms": sum(o > 10 for o in oversleeps_ms)}))  # fmt: skip


if __name__ == "__main__":
    main()
