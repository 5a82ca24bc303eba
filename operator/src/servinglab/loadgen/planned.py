"""How long a load section runs at most, from the spec alone (pure): what a deadline on the load must
cover before anything has been measured.

Every run of a level is its warm-up, its measured window at its longest (a stability extension up to
`maxDurationSeconds`) and the wait for requests still in flight (up to the request timeout); a level
runs `repeats` times; the peak-rate search adds up to `maxProbes` levels; a utilisation search runs up to
`maxProbes` probes, each read after its window, and with `probeSeconds` one measurement more; a shaped run
is one run of its warm-up and all its phases (a trace's length is known only from its file: its bound is
taken). This is
the schedule :mod:`servinglab.loadgen.levels` runs. Used by the operator for the load Job's deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from servinglab.api import LoadSpec
from servinglab.loadgen.shapes import MAX_TRACE_SECONDS


@dataclass(frozen=True)
class PlannedLoad:
    """The runs a load section makes and the longest each can take."""

    runs: int
    run_seconds: float

    @property
    def seconds(self) -> float:
        return self.runs * self.run_seconds


def planned_load(load: LoadSpec, reading_seconds: float = 0.0) -> PlannedLoad:
    """The runs of `load` and the longest one run may take, stragglers included; `reading_seconds`: the
    longest a utilisation search's reading of one probe may take after its window (in the load Job, from
    Prometheus)."""
    tail = load.warmup_seconds + load.request_timeout_seconds
    shape = load.shape
    if shape is not None:  # one run, never extended
        if shape.step is not None:
            measured = len(shape.step.rates or shape.step.users or []) * shape.step.step_seconds
        elif shape.burst is not None:
            measured = shape.burst.duration_seconds
        else:
            measured = MAX_TRACE_SECONDS
        return PlannedLoad(1, measured + tail)
    measured = max(load.duration_seconds, load.stability.max_duration_seconds or 0.0)
    if (aim := load.utilisation_target) is not None:  # its probes, each read, then the load found measured
        runs = aim.max_probes + (1 if aim.probe_seconds is not None else 0)
        return PlannedLoad(runs, measured + tail + reading_seconds)
    if load.mode == "closed":
        levels = len(load.concurrency)
    else:
        levels = len(load.rates) + (load.rate_search.max_probes if load.rate_search is not None else 0)
    measured = max(load.duration_seconds, load.stability.max_duration_seconds or 0.0)
    return PlannedLoad(levels * load.repeats, measured + tail)
