"""The load Job's deadline (`activeDeadlineSeconds`), from the planned schedule (pure).

The Job is killed at its deadline whatever it is doing, so the deadline covers the worst legal case of
everything the Job's pod does: its start (scheduling, the image pull, the interpreter), the wait for the
server to answer (the spec's `startupTimeoutSeconds`, the program's `--ready-timeout`), several load pods
joining the first, every run of the load at its longest (:mod:`servinglab.loadgen.planned`), and the
results write with its retries (:data:`servinglab.k8s.sink.WRITE_SECONDS`). A Job that ends before its
deadline is not slowed by it: the deadline only bounds a Job that hangs. Used by the load Job's builder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servinglab.api import ExperimentSpec
from servinglab.k8s.podutilisation import READING_SECONDS
from servinglab.k8s.sink import WRITE_SECONDS
from servinglab.loadgen.planned import planned_load

#: A load pod's start: scheduled, its image pulled (a cold node pulls a few GB), Python and Locust imported.
POD_START_SECONDS = 300.0
#: The other load pods of a multi-generator Job join the first after the server answers (servinglab.k8s.loadjob).
GENERATORS_JOIN_SECONDS = 120.0


@dataclass(frozen=True)
class Deadline:
    """The load Job's deadline and what it is made of, in seconds."""

    start: float
    load: float
    write: float

    @property
    def seconds(self) -> int:
        return math.ceil(self.start + self.load + self.write)


def load_job_deadline(spec: ExperimentSpec) -> Deadline:
    """The deadline of the load Job of `spec`."""
    generators = spec.load.generators if isinstance(spec.load.generators, int) else 1
    start = POD_START_SECONDS + spec.server.startup_timeout_seconds + (GENERATORS_JOIN_SECONDS if generators > 1 else 0)
    return Deadline(start=start, load=planned_load(spec.load, READING_SECONDS).seconds, write=WRITE_SECONDS)
