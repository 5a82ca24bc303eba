"""Can a level's numbers be trusted? Its marks (stable / UNSTABLE / short; GENERATOR-LIMITED) and
the reasons behind them, for the table and the report (pure)."""

from __future__ import annotations

from servinglab.api.results import LevelResult


def trust_checks(level: LevelResult) -> tuple[list[str], list[str]]:
    """A level's trust marks and the reasons behind them (a level read from the first status layout
    carries only its flags: marks without reasons)."""
    marks: list[str] = []
    reasons: list[str] = []
    stability = level.stability
    if stability is not None or level.stable is not None:
        stable = level.is_stable
        marks.append("stable" if stable is True else "UNSTABLE" if stable is False else "short")
        if stable is False and stability is not None:
            reasons.append(f"unstable after {stability.measured_seconds} s: {stability.reason}")
    if level.generator_limited:
        marks.append("GENERATOR-LIMITED")
        if level.generator is not None:
            reasons.append(f"the load generator limited this level ({level.generator.reason})")
    return marks, reasons
