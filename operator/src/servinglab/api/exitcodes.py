"""The exit codes of the `servinglab` command, one meaning each (the README lists them).

The load Job's codes are the same ones: a Kubernetes Job's pod ends with them, and its termination
message says the rest.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    #: The file or the arguments are invalid (every bad field named), or what they name does not exist.
    INVALID = 1
    #: The experiment or sweep ran and failed, or the cluster could not be reached: the reason is printed.
    FAILED = 2
    #: `prepare-model`: the model cannot be served (ModelDownloadFailed, ModelChecksumMismatch, ...).
    MODEL_UNSERVABLE = 3
    #: The load Job could not store its results through the API within its write deadline.
    RESULTS_NOT_STORED = 4
    #: The load Job's server never answered a first request before its deadline.
    SERVER_NEVER_ANSWERED = 5
    #: Several load generators could not be brought together, or one stopped answering.
    GENERATORS_FAILED = 6
    #: The server's metrics could not be read at a window's edge.
    METRICS_UNREADABLE = 7
    #: The load Job's server says it runs with other settings than the spec asked for (no load was sent).
    SETTINGS_NOT_APPLIED = 8
    #: The run was interrupted: 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM).
    INTERRUPTED = 128


def interrupted(signum: int) -> int:
    return ExitCode.INTERRUPTED + signum
