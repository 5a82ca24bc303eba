"""The load that holds a server's utilisation at a target (a bounded search over a probe function).

Like the peak-rate search (:mod:`servinglab.loadgen.peak`), a pure function of what each probe measured:
from `start` the load (a closed loop's users, an open loop's rate) doubles until a probe's utilisation
is above the band `target ± tolerance`, which brackets it; the bracket is then narrowed by interpolating
the utilisation between its ends (it grows about in proportion to the load until the server saturates),
until a probe lands in the band. It stops early, with the reason (:class:`~servinglab.api.utilisation.
NeverReached`), when a probe cannot vouch for the server (the generator limited it), breaks the SLO at or
below the target, shows the server at its limit (the load doubled, the utilisation did not move), or when
the load, the probes or the time allowed are spent. What the utilisation is and whether a probe met the
SLO are the caller's to say (:mod:`servinglab.measure.driver`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from servinglab.api.utilisation import NeverReached, UtilisationSearch, UtilisationStep, UtilisationTargetSpec
from servinglab.loadgen.stats import LevelStats

#: A doubled load that raised the utilisation by less than this share found the server at its limit.
PLATEAU_GAIN = 0.10
#: A bisection probe stays this share of the bracket away from its ends, so every probe narrows it.
INTERIOR = 0.1
#: An open loop's bracket this narrow (relative) holds no rate in the band: the utilisation jumps across it.
NARROWEST = 0.01


@dataclass(frozen=True)
class Probe:
    """What one probe measured: the load's figures and the utilisation over the same window (None: unread)."""

    stats: LevelStats
    utilisation: float | None
    level_index: int


#: A search's end: why the target was not reached (None: it was) and the sentence that says so.
Stop = tuple[NeverReached | None, str]


def search_utilisation(
    probe: Callable[[float], Probe],
    aim: UtilisationTargetSpec,
    resource: Literal["gpu", "cpu"],
    closed: bool,
    meets_slo: Callable[[LevelStats], bool],
    clock: Callable[[], float] = time.monotonic,
) -> tuple[UtilisationSearch, Probe | None]:
    """Probe loads until one holds the utilisation; (the search's summary, the probe in the band or None)."""
    first, most = aim.bounds(closed)
    began = clock()
    steps: list[UtilisationStep] = []
    below: tuple[float, float] | None = None  # (load, utilisation) of the highest probe under the band
    above: tuple[float, float] | None = None  # ... of the lowest probe over it
    load: float | None = first
    landed: Probe | None = None
    stop: Stop | None = None
    while stop is None:
        if load is None:
            assert below is not None and above is not None
            stop = (
                NeverReached.BETWEEN_LOADS,
                (
                    f"{_label(below[0], closed)} used {below[1]:.3g} and {_label(above[0], closed)} {above[1]:.3g}: "
                    "no load between them to try"
                ),
            )
        elif len(steps) >= aim.max_probes:
            stop = NeverReached.BUDGET, f"{aim.max_probes} probes spent before one held the target"
        elif aim.max_seconds is not None and clock() - began >= aim.max_seconds:
            stop = NeverReached.BUDGET, f"{aim.max_seconds:g} s spent before a probe held the target"
        else:
            measured = probe(load)
            saturated = measured.stats.generator is not None and measured.stats.generator.saturated
            slo_met = meets_slo(measured.stats)
            steps.append(_step(measured, slo_met, saturated))
            stop = _judged(measured, aim, resource, _label(load, closed), slo_met, saturated)
            used = measured.utilisation
            if stop is not None and stop[0] is None:
                landed = measured
            elif stop is None and used is not None and used > aim.target:
                if below is None:
                    stop = NeverReached.START_ABOVE, f"the first probe, {_label(load, closed)}, already used {used:.3g}"
                above = (load, used)
            elif stop is None and used is not None:
                stop = _still_rising(below, above, (load, used), most, closed)
                below = (load, used)
            load = _next_load(below, above, aim.target, closed, most) if stop is None else None
    summary = UtilisationSearch(
        resource=resource, target=aim.target, tolerance=aim.tolerance, reached=landed is not None,
        reason=stop[0], note=stop[1], probes=len(steps), steps=steps,
    )  # fmt: skip
    return (with_level(summary, landed) if landed is not None else summary), landed


def _judged(
    measured: Probe, aim: UtilisationTargetSpec, resource: str, at: str, slo_met: bool, saturated: bool
) -> Stop | None:
    """What one probe alone says: the search ends (no reading, a limiting generator, the SLO broken at or
    under the target, or the target held), or goes on (None)."""
    used = measured.utilisation
    if used is None:
        return NeverReached.NO_READING, f"the {resource} utilisation could not be read at {at}"
    if saturated:
        why = (measured.stats.generator.reason if measured.stats.generator else None) or "its own verdict"
        return NeverReached.GENERATOR, f"the load generator limited the probe at {at} ({why})"
    if used <= aim.target + aim.tolerance and not slo_met:
        return NeverReached.SLO, f"the SLO broke at {at}, utilisation {used:.3g}, not above the target"
    if abs(used - aim.target) <= aim.tolerance:
        return None, f"utilisation {used:.3g} at {at}"
    return None


def _still_rising(
    below: tuple[float, float] | None,
    above: tuple[float, float] | None,
    now: tuple[float, float],
    most: float,
    closed: bool,
) -> Stop | None:
    """A probe under the band while the load still doubles: the server at its limit when the utilisation
    stayed flat, the spec's when maxLoad is reached."""
    if above is not None:
        return None
    load, used = now
    if below is not None and used < below[1] * (1 + PLATEAU_GAIN):
        return NeverReached.SERVER_LIMIT, (
            f"the load rose from {_label(below[0], closed)} to {_label(load, closed)} and the utilisation stayed "
            f"at {used:.3g} (was {below[1]:.3g})"
        )
    if load >= most:
        return NeverReached.MAX_LOAD, f"maxLoad {_label(load, closed)} used only {used:.3g}"
    return None


def _next_load(
    below: tuple[float, float] | None, above: tuple[float, float] | None, target: float, closed: bool, most: float
) -> float | None:
    """Double until bracketed; then interpolate inside the bracket (None: nothing left inside it)."""
    assert below is not None
    low, low_used = below
    if above is None:
        return min(low * 2, most)
    high, high_used = above
    share = (target - low_used) / (high_used - low_used) if high_used > low_used else 0.5
    share = min(max(share, INTERIOR), 1 - INTERIOR)
    if closed:
        if high - low <= 1:
            return None
        return float(min(max(round(low + share * (high - low)), low + 1), high - 1))
    if high / low - 1 <= NARROWEST:
        return None
    return low + share * (high - low)


def _label(load: float, closed: bool) -> str:
    return f"c={int(load)}" if closed else f"{load:.4g} rps"


def _step(measured: Probe, slo_met: bool, saturated: bool) -> UtilisationStep:
    stats = measured.stats
    p99 = stats.latency_ms.p99
    return UtilisationStep(
        concurrency=stats.concurrency, rate_rps=round(stats.rate_rps, 3) if stats.rate_rps is not None else None,
        utilisation=round(measured.utilisation, 3) if measured.utilisation is not None else None,
        throughput_rps=round(stats.throughput_rps, 3), p99_latency_ms=round(p99, 3) if p99 is not None else None,
        meets_slo=slo_met, generator_saturated=saturated, level_index=measured.level_index,
    )  # fmt: skip


def with_level(summary: UtilisationSearch, measured: Probe) -> UtilisationSearch:
    """The summary with the figures of the level measured at the load found (a probe, or a longer run there)."""
    stats = measured.stats
    return summary.model_copy(update={
        "concurrency": stats.concurrency,
        "rate_rps": round(stats.rate_rps, 3) if stats.concurrency is None and stats.rate_rps is not None else None,
        "utilisation": round(measured.utilisation, 3) if measured.utilisation is not None else None,
        "throughput_rps": round(stats.throughput_rps, 3),
        "latency_ms": {key: round(value, 3) for key, value in stats.latency_ms if isinstance(value, float)},
        "level_index": measured.level_index,
    })  # fmt: skip


def at_the_load_found(summary: UtilisationSearch, measured: Probe) -> UtilisationSearch:
    """The summary after the longer measurement at the load found; a utilisation that drifted out of the band
    there is told, not hidden."""
    found = with_level(summary, measured)
    used = measured.utilisation
    if used is None or abs(used - summary.target) > summary.tolerance:
        drift = "unread" if used is None else f"{used:.3g}"
        found = found.model_copy(update={"note": f"{summary.note}; measured there for longer: utilisation {drift}, "
                                                 "outside the band"})  # fmt: skip
    return found


@dataclass(frozen=True)
class Reading:
    """How the caller reads a probe: the resource's utilisation over a level's window (by its index in the
    run; None: unread), and whether the level met the SLO."""

    resource: Literal["gpu", "cpu"]
    utilisation: Callable[[int], float | None]
    meets_slo: Callable[[LevelStats], bool]


def hold_utilisation(
    aim: UtilisationTargetSpec,
    closed: bool,
    duration_seconds: float,
    run_one: Callable[[float, int, float], LevelStats],
    reading: Reading,
) -> tuple[list[LevelStats], UtilisationSearch]:
    """Every level the search ran, in order (probes, then with `probeSeconds` the measurement at the load
    found), and its summary."""
    levels: list[LevelStats] = []

    def run(load: float, seconds: float) -> Probe:
        index = len(levels)
        levels.append(run_one(load, index, seconds))
        return Probe(levels[-1], reading.utilisation(index), index)

    summary, landed = search_utilisation(
        partial(run, seconds=aim.probe_seconds or duration_seconds), aim, reading.resource, closed, reading.meets_slo
    )
    if landed is not None and aim.probe_seconds is not None:
        level = landed.stats.concurrency if closed else landed.stats.rate_rps
        assert level is not None
        summary = at_the_load_found(summary, run(float(level), duration_seconds))
    return levels, summary
