"""Naming the winner with confidence: the top candidates measured again, alternating, then compared (pure).

One measurement per trial picks the best badly on a noisy machine: the same configuration measures
+-30 % from run to run on shared cores, so the top of a sweep is partly luck (and the luckiest trial is
the one that looks best). Once the search or the grid has stopped, the `confirm.candidates` best trials
are measured again `confirm.rounds` times in alternation — A B C, A B C, ... — so a drift of the machine
over time falls on every candidate alike. Only these re-measurements decide (the first measurements
chose the candidates, so they are biased upwards).

The comparison is on the logarithms of the capacities (noise and a machine's slow-downs scale with the
figure), in a two-way layout without interaction (candidate + round): the residual variance, pooled over
candidates and rounds, has (K-1)(R-1) degrees of freedom and removes what each round shared. The
candidate with the highest mean is the winner; another candidate whose mean is within Student's t
(95 %, two-sided) times the standard error of a difference of two means is *tied* with it (a run with no
level within the objective counts as 1 % of the best run) — unless the two tell themselves apart: their
round-by-round differences, on their own (a paired t-test), show the winner ahead. One wild candidate
inflates the pooled noise for all; it must not tie two candidates whose own runs never overlap. With a tie the
configuration named is the cheapest of the tied ones — fewest workers, then the smallest batch, the
shortest delay, the precision listed first — so a second run, which finds the same tie, names the same
one. The winner's interval is its own runs' 95 % t-interval.

Like the search, a function of the records alone: a local sweep and the sweep reconciler ask
:func:`pending` what to run next and :func:`decide` what it means.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from servinglab.api import SweepSpec, TrialConfig, axis_values
from servinglab.api.trials import CandidateRuns, Confirmation, TrialRecord

#: Student's t, two-sided 95 %, by degrees of freedom (1..30); beyond, the normal's 1.96 is close enough.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)  # fmt: skip


def t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else 1.96


@dataclass(frozen=True)
class Run:
    """A confirmation to start: the candidate trial it measures again, and its round (1-based)."""

    trial: TrialRecord
    round: int


def candidates(spec: SweepSpec, records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The trials measured again: the best `confirm.candidates` by their first capacity (earliest first
    among equals); none when confirmation is off or fewer than one trial has a capacity."""
    if spec.confirm.rounds == 0:
        return []
    scored = [r for r in records if r.confirms is None and r.capacity_rps is not None]
    ranked = sorted(scored, key=lambda r: (-(r.capacity_rps or 0.0), r.order))
    return ranked[: spec.confirm.candidates] if len(ranked) > 1 else []


def pending(spec: SweepSpec, records: Sequence[TrialRecord], confirmations: Sequence[TrialRecord],
            running: Sequence[str], slots: int) -> list[Run]:  # fmt: skip
    """The next confirmations to start (at most `slots`), in alternation order; a round starts only when
    the one before it has finished, so every round measures the candidates close together in time.
    `running`: names of confirmations under way."""
    chosen = candidates(spec, records)
    done = {(c.confirms, c.round) for c in confirmations}
    busy = set(running)
    found: list[Run] = []
    for round_ in range(1, spec.confirm.rounds + 1):
        missing = [trial for trial in chosen if (trial.name, round_) not in done]
        if not missing:
            continue
        for trial in missing:
            if f"{trial.name}-r{round_}" not in busy and not any(run.trial.name == trial.name for run in found):
                found.append(Run(trial, round_))
        break  # the next round waits for this one
    return found[: max(slots, 0)]


def cheapest_first(spec: SweepSpec, config: TrialConfig) -> tuple[int, int, int, int]:
    """Preference among tied configurations: fewest workers, smallest batch, shortest delay, then the
    precision listed first."""
    precisions = [str(p) for p in axis_values(spec)[3]] if spec.strategy != "list" else []
    rank = precisions.index(str(config.precision)) if str(config.precision) in precisions else 0
    return (config.workers, config.batch_size, config.max_batch_delay_ms, rank)


def decide(
    spec: SweepSpec, records: Sequence[TrialRecord], confirmations: Sequence[TrialRecord]
) -> Confirmation | None:
    """The confirmation as it stands (None when there is none, or none of its runs has finished yet):
    Running until every round is in, then Confirmed or Tie, with the trial named best."""
    chosen = candidates(spec, records)
    names = {trial.name for trial in chosen}
    if not chosen or not any(run.confirms in names for run in confirmations):
        return None
    rounds = spec.confirm.rounds
    runs: dict[str, dict[int, float]] = {trial.name: {} for trial in chosen}
    for run in confirmations:
        if run.confirms in runs and run.round is not None and 1 <= run.round <= rounds:
            runs[run.confirms][run.round] = run.capacity_rps or 0.0  # no level within the objective: 0
    rows = {name: [by_round[r] for r in sorted(by_round)] for name, by_round in runs.items()}
    complete = all(len(row) == rounds for row in rows.values())
    if not complete:
        listed = [CandidateRuns(trial=t.name, config=t.config, first_rps=t.capacity_rps, runs_rps=rows[t.name])
                  for t in chosen]  # fmt: skip
        return Confirmation(state="Running", rounds=rounds, candidates=listed)
    floor = max(max(row) for row in rows.values()) / 100 or 1.0
    logs = {name: [math.log(max(value, floor)) for value in row] for name, row in rows.items()}
    means = {name: statistics.fmean(values) for name, values in logs.items()}
    count = len(chosen)
    round_means = [statistics.fmean(logs[t.name][r] for t in chosen) for r in range(rounds)]
    grand = statistics.fmean(means.values())
    residual = sum((logs[t.name][r] - means[t.name] - round_means[r] + grand) ** 2
                   for t in chosen for r in range(rounds))  # fmt: skip
    df = (count - 1) * (rounds - 1)
    spread = t95(df) * math.sqrt(residual / df)
    margin = spread * math.sqrt(2 / rounds)
    top = max(chosen, key=lambda t: (means[t.name], -t.order))
    tied = [
        t for t in chosen
        if t.name != top.name and means[top.name] - means[t.name] <= margin and not _apart(logs[top.name], logs[t.name])
    ]  # fmt: skip
    named = min([top, *tied], key=lambda t: cheapest_first(spec, t.config))
    listed = []
    for trial in chosen:
        mean, half = means[trial.name], spread / math.sqrt(rounds)
        listed.append(CandidateRuns(
            trial=trial.name, config=trial.config, first_rps=trial.capacity_rps, runs_rps=rows[trial.name],
            mean_rps=round(math.exp(mean), 3), low_rps=round(math.exp(mean - half), 3),
            high_rps=round(math.exp(mean + half), 3), tied=trial.name == top.name or trial in tied,
        ))  # fmt: skip
    note = (f"{rounds} alternated rounds of {count} candidates; a difference below {math.expm1(margin):.0%} cannot be "
            f"told from noise (t95 over {df} degrees of freedom)")  # fmt: skip
    if tied:
        note += f"; {named.name} named: the cheapest of the tied (fewest workers, smallest batch, shortest delay)"
    return Confirmation(
        state="Tie" if tied else "Confirmed", rounds=rounds, candidates=listed, winner=named.name,
        tied_with=sorted(t.name for t in [top, *tied] if t.name != named.name), note=note,
    )  # fmt: skip


def _apart(top: Sequence[float], other: Sequence[float]) -> bool:
    """Whether `top` is ahead of `other` by their own round-by-round differences (a one-sided paired t-test
    at 95 % two-sided strictness): what the pooled noise cannot see when another candidate is wild."""
    differences = [a - b for a, b in zip(top, other, strict=True)]
    if len(differences) < 2:
        return False
    mean, spread = statistics.fmean(differences), statistics.stdev(differences)
    return mean > 0 and mean > t95(len(differences) - 1) * spread / math.sqrt(len(differences))
