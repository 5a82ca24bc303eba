"""Sleeping until a send is due, to well under a millisecond, without busy-waiting.

gevent's timers ride on the event loop's epoll wait, whose time-out is whole milliseconds, rounded
up: a send scheduled by `gevent.sleep` leaves up to a millisecond late, half a millisecond on
average. A Linux timerfd has nanosecond resolution and wakes the loop as I/O the moment it fires,
so the open loop waits on one instead: the loop stays free for answers meanwhile and no CPU is spent
spinning (which would also read as generator load). Elsewhere (no timerfd) it falls back to
`gevent.sleep`. Used by :mod:`servinglab.loadgen.open_loop`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import time
from typing import ClassVar

import gevent
from gevent.socket import wait_read

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_: ClassVar = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_: ClassVar = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.timerfd_create  # noqa: B018  - present on Linux only
    except (OSError, AttributeError):
        return None
    return libc


class PreciseSleeper:
    """`sleep_until(due)` (a `time.perf_counter` time) on one timerfd; `close()` when done."""

    def __init__(self) -> None:
        self._libc = _libc()
        self._fd = -1
        if self._libc is not None:
            self._fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)

    def sleep_until(self, due: float) -> None:
        left = due - time.perf_counter()
        if left <= 0:
            return
        if self._fd < 0 or self._libc is None:
            gevent.sleep(left)
            return
        seconds = int(left)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(seconds, max(1, int((left - seconds) * 1e9))))
        if self._libc.timerfd_settime(self._fd, 0, ctypes.byref(spec), None) != 0:
            gevent.sleep(left)
            return
        wait_read(self._fd)
        with contextlib.suppress(BlockingIOError):  # a spurious wake-up: nothing to consume
            os.read(self._fd, 8)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> PreciseSleeper:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
