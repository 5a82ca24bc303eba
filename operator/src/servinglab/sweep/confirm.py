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
(95 %, two-sided) times the standard error of a difference of two means is *tied* with it — unless the
two tell themselves apart: their
round-by-round differences, on their own (a paired t-test), show the winner ahead. One wild candidate
inflates the pooled noise for all; it must not tie two candidates whose own runs never overlap. With a tie the
configuration named is the cheapest of the tied ones — fewest workers, then the smallest batch, the
shortest delay, the precision listed first — so a second run, which finds the same tie, names the same
one. The winner's interval is its own runs' 95 % t-interval.

A run with no level within the objective (its p99's upper bound over the SLO: a stall, a slow tail) is a
fact about the configuration's tail, not a capacity of 0: it is counted as a *miss*, with its best p99 and
bound, and kept out of the capacities. Only candidates that met the objective in most of their runs
contend (else those that met it in the most runs); among them the capacities of the runs that met are
compared, the noise coming from the rounds in which every contender met (or, with fewer than two such
rounds, from each one's spread about its own mean). Averaging a stalled run in as 0 (or 1 % of the best)
once turned 1,480, 1,288 and a stall into "304 rps" and a "3016 %" noise that tied everything.

Like the search, a function of the records alone: a local sweep and the sweep reconciler ask
:func:`pending` what to run next and :func:`decide` what it means.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from servinglab.api import SweepSpec, TrialConfig, axis_values
from servinglab.api.states import ConfirmationState
from servinglab.api.trials import CandidateRuns, Confirmation, MissedRun, TrialRecord
from servinglab.measure.levels import judged_p99
from servinglab.sweep import objective

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
    """The trials measured again: the best `confirm.candidates` by their first score for the objective (earliest first
    among equals); none when confirmation is off or fewer than two trials have a capacity."""
    if spec.confirm.rounds == 0:
        return []
    firsts = [r for r in records if r.confirms is None]
    scored = [(found, r) for r in firsts if (found := objective.of(spec.objective, r)) is not None]
    ranked = [r for _, r in sorted(scored, key=lambda pair: (-pair[0], pair[1].order))]
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


def missed_run(run: TrialRecord) -> MissedRun:
    """A run with no level within the objective, with its best level's p99 and that p99's upper bound."""
    levels = [level for level in (run.results.results if run.results is not None else []) if level.latency_ms.p99]
    if not levels:
        return MissedRun(round=run.round or 0)
    best = min(levels, key=lambda level: judged_p99(level.latency_ms)[0] or math.inf)
    bounds = best.latency_ms.p99_interval
    return MissedRun(round=run.round or 0, p99_latency_ms=best.latency_ms.p99,
                     p99_upper_ms=bounds.upper if bounds is not None else None)  # fmt: skip


def _noise(logs: dict[str, dict[int, float]], means: dict[str, float], rounds: int) -> tuple[float, int]:
    """The noise of one log-capacity, and its degrees of freedom: from the two-way layout (candidate +
    round) over the rounds in which every contender met the objective when there are two or more of them;
    else from each contender's spread about its own mean; infinite when neither can be estimated."""
    names = list(logs)
    full = [r for r in range(1, rounds + 1) if all(r in logs[name] for name in names)]
    if len(full) >= 2 and len(names) >= 2:
        own = {name: statistics.fmean(logs[name][r] for r in full) for name in names}
        round_means = {r: statistics.fmean(logs[name][r] for name in names) for r in full}
        grand = statistics.fmean(own.values())
        residual = sum((logs[name][r] - own[name] - round_means[r] + grand) ** 2 for name in names for r in full)
        df = (len(names) - 1) * (len(full) - 1)
    else:
        residual = sum((value - means[name]) ** 2 for name in names for value in logs[name].values())
        df = sum(len(values) for values in logs.values()) - len(names)
    return (math.sqrt(residual / df), df) if df >= 1 else (math.inf, 0)


def decide(
    spec: SweepSpec, records: Sequence[TrialRecord], confirmations: Sequence[TrialRecord]
) -> Confirmation | None:
    """The confirmation as it stands (None when there is none, or none of its runs has finished yet):
    Running until every round is in, then Confirmed or Tie with the trial named best (NoneWithinSlo when
    no run of any candidate met the objective)."""
    chosen = candidates(spec, records)
    names = {trial.name for trial in chosen}
    if not chosen or not any(run.confirms in names for run in confirmations):
        return None
    rounds = spec.confirm.rounds
    runs: dict[str, dict[int, TrialRecord]] = {trial.name: {} for trial in chosen}
    for run in confirmations:
        if run.confirms in runs and run.round is not None and 1 <= run.round <= rounds:
            runs[run.confirms][run.round] = run
    met = {name: {r: run.capacity_rps for r, run in sorted(by_round.items()) if run.capacity_rps is not None}
           for name, by_round in runs.items()}  # fmt: skip
    missed = {name: [missed_run(run) for _, run in sorted(by_round.items()) if run.capacity_rps is None]
              for name, by_round in runs.items()}  # fmt: skip

    def listed(name: str, **figures: object) -> CandidateRuns:
        trial = next(t for t in chosen if t.name == name)
        return CandidateRuns.model_validate({
            "trial": name, "config": trial.config, "first_rps": trial.capacity_rps,
            "runs_rps": list(met[name].values()), "missed": missed[name] or None, **figures,
        })  # fmt: skip

    if not all(len(by_round) == rounds for by_round in runs.values()):
        return Confirmation(state=ConfirmationState.RUNNING, rounds=rounds, candidates=[listed(t.name) for t in chosen])
    # who can win: the candidates that met the objective in most of their runs (else those that met it in
    # the most runs); a run that missed is a fact about the tail, kept out of the capacities compared
    contenders = [t for t in chosen if 2 * len(met[t.name]) > rounds]
    if not contenders:
        most = max(len(met[t.name]) for t in chosen)
        contenders = [t for t in chosen if most and len(met[t.name]) == most]
    misses = "; ".join(f"{t.name} missed the objective in {len(missed[t.name])} of {rounds} runs"
                       for t in chosen if missed[t.name])  # fmt: skip
    if not contenders:
        return Confirmation(state=ConfirmationState.NONE_WITHIN_SLO, rounds=rounds,
                            candidates=[listed(t.name) for t in chosen],
                            note=f"no candidate met the objective in any of its {rounds} runs")  # fmt: skip
    # compared in the objective's terms: log score = log capacity + a candidate's own offset (0 for throughput,
    # -log price for cost), the same in each of its runs, so the noise and the paired test are unchanged
    offset = {t.name: math.log(objective.score(spec.objective, 1.0, t.cost) or 1.0) for t in contenders}
    logs = {t.name: {r: math.log(max(value, 1e-9)) + offset[t.name] for r, value in met[t.name].items()}
            for t in contenders}  # fmt: skip
    means = {name: statistics.fmean(values.values()) for name, values in logs.items()}
    sigma, df = _noise(logs, means, rounds)
    student = t95(df) if df else math.inf

    def margin(a: str, b: str) -> float:  # a difference of two means within the noise
        return student * sigma * math.sqrt(1 / len(logs[a]) + 1 / len(logs[b]))

    top = max(contenders, key=lambda c: (means[c.name], -c.order))
    tied = [
        c for c in contenders
        if c.name != top.name and means[top.name] - means[c.name] <= margin(top.name, c.name)
        and not _apart(logs[top.name], logs[c.name])
    ]  # fmt: skip
    named = min([top, *tied], key=lambda c: cheapest_first(spec, c.config))
    entries = []
    for trial in chosen:
        if trial not in contenders:
            entries.append(listed(trial.name, tied=False))
            continue
        mean, half = means[trial.name] - offset[trial.name], student * sigma / math.sqrt(len(logs[trial.name]))
        bounds = {"low_rps": round(math.exp(mean - half), 3), "high_rps": round(math.exp(mean + half), 3)}
        tie = trial.name == top.name or trial in tied
        entries.append(listed(trial.name, mean_rps=round(math.exp(mean), 3), tied=tie,
                              **(bounds if math.isfinite(half) else {})))  # fmt: skip
    if len(contenders) > 1:
        told = margin(top.name, top.name)
        noise = f"{math.expm1(told):.0%}" if math.isfinite(told) else "any size"
        note = (f"{rounds} alternated rounds of {len(chosen)} candidates; a difference below {noise} cannot be "
                f"told from noise (t95 over {df} degrees of freedom)")  # fmt: skip
    else:
        note = f"{rounds} alternated rounds of {len(chosen)} candidates; {top.name} alone met the objective in most"
    if misses:
        note += f"; {misses} (counted as misses, not as capacity)"
    if tied:
        note += f"; {named.name} named: the cheapest of the tied (fewest workers, smallest batch, shortest delay)"
    return Confirmation(
        state=ConfirmationState.TIE if tied else ConfirmationState.CONFIRMED, rounds=rounds, candidates=entries,
        winner=named.name,
        tied_with=sorted(c.name for c in [top, *tied] if c.name != named.name), note=note,
    )  # fmt: skip


def _apart(top: dict[int, float], other: dict[int, float]) -> bool:
    """Whether `top` is ahead of `other` by their own round-by-round differences over the rounds both met
    the objective (a one-sided paired t-test at 95 % two-sided strictness): what the pooled noise cannot
    see when another candidate is wild."""
    differences = [top[r] - other[r] for r in top if r in other]
    if len(differences) < 2:
        return False
    mean, spread = statistics.fmean(differences), statistics.stdev(differences)
    return mean > 0 and mean > t95(len(differences) - 1) * spread / math.sqrt(len(differences))
