"""Watch this host's scheduling while a load-generator test runs; print what it saw as JSON.

    python host_stalls.py            (runs until stdin closes)

It sleeps 2 ms at a time and records every oversleep over 10 ms, with its time: on a shared machine
another process (or the hypervisor) can hold the CPU for tens or hundreds of milliseconds, and then
*any* generator sends late. Every 100 ms it also reads Linux's CPU pressure (the time some task
waited for a CPU, /proc/pressure/cpu), which counts the stalls of every process, not only its own.
The tests use it (see hoststalls.py) to tell a generator that cannot keep time from a busy host.
"""

from __future__ import annotations

import json
import sys
import threading
import time

TICK_S = 0.002
PRESSURE_EVERY_S = 0.1


def waited_us() -> int | None:
    try:
        with open("/proc/pressure/cpu") as pressure:
            some = pressure.readline().split()
        return int(dict(field.split("=") for field in some[1:])["total"])
    except (OSError, KeyError, ValueError):
        return None


def main() -> None:
    done = threading.Event()

    def wait_for_stdin_to_close() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_stdin_to_close, daemon=True).start()
    stalls: list[tuple[float, float]] = []  # (epoch time, oversleep ms) over 10 ms
    pressure: list[tuple[float, int]] = []  # (epoch time, microseconds some task has waited since boot)
    next_pressure = 0.0
    while not done.is_set():
        before = time.perf_counter()
        time.sleep(TICK_S)
        oversleep_ms = (time.perf_counter() - before - TICK_S) * 1000.0
        now = time.time()
        if oversleep_ms > 10.0:
            stalls.append((round(now, 3), round(oversleep_ms, 1)))
        if now >= next_pressure and (waited := waited_us()) is not None:
            pressure.append((round(now, 3), waited))
            next_pressure = now + PRESSURE_EVERY_S
    print(json.dumps({"stalls": stalls, "pressure": pressure}))


if __name__ == "__main__":
    main()
