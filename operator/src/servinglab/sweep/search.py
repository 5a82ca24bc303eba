"""Which configurations a sweep tries next: grid, list, or a search that needs far fewer trials.

Pure and deterministic: :func:`propose` is a function of the sweep spec and the outcomes so far
(plus what is running), with no hidden state, so a sweep resumes after a restart by replaying what
the API server or the output folder holds, and a test drives it on synthetic response surfaces.

The search works on the lattice of axis indexes (batch, delay, workers ascending; the *variant* — the
precision with the data path and the model's form — as a category; "precision" below means the variant) and improves on
Model Analyzer's quick search (coordinate hill-climbing from the small corner) in five ways:

1. **Precision screening**: the start point (middle batch and delay, fewest workers) is measured at
   every precision first; a precision whose best is below SCREEN_RATIO of the overall best is
   dominated and not climbed (a cross-check at the end can revive it).
2. **Start in the middle** of the batch and delay axes, not the small corner: about half the climb.
3. **First improvement with momentum**: neighbours (one index step on one axis, the queue delay
   included) are tried one at a time, the direction of the last successful move first, and the
   climb moves as soon as one is better.
4. **Pruning**: an out-of-memory at (precision, batch, workers) marks every configuration with at
   least that batch and those workers at that precision as infeasible without running it — in the
   grid too.
5. **Stopping**: on convergence (every neighbour of each live precision's best tried, and the best
   configuration cross-checked at the other precisions), after `stop.patience` trials without an
   improvement of `stop.minImprovement`, or at `maxTrials`.
6. **The verdict first**: a trial's bottleneck verdict (:mod:`servinglab.measure.verdict`) names the axis
   its next change moves — more workers when queue-bound, a larger batch when batches are full, a longer
   delay when the delay forms them, a shorter one when requests wait on it, the handler's decode axis when
   preprocess-bound (where the space has it) — and the climb tries that neighbour before any other. When
   the best configuration serves near the model's raw ceiling, nothing the server's settings change can
   add much: the search stops once the moves that verdict points at are tried — a faster form first, where
   the verdict names one (the model alone in it is faster than in the served form: `ceiling.forms`).

With a `kind` axis each server is searched as a sweep of its own, since its knobs mean other things than
another server's: on its own lattice (its axes), with its own precision screening, climb, pruning and
patience (measured against its own best, so a server slower than another still climbs to its best), and
an equal share of `maxTrials`. Servers are run one after the other, in the axis' order (a local sweep then
restarts its server once per server, not once per trial); on a cluster the next server's trials fill
the slots the current one leaves free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servinglab.api import DataPath, Decode, ServerKind, SweepSpec, TrialConfig, axis_values, grid, kinds
from servinglab.api.reasons import Reason
from servinglab.api.sweep import variants
from servinglab.api.trialconfig import ConfigKey
from servinglab.api.verdicts import Bottleneck, Verdict

#: A precision whose best is below this share of the overall best is not climbed.
SCREEN_RATIO = 0.75
#: Trial outcomes that imply larger configurations fail too (same precision, >= batch and workers).
OUT_OF_MEMORY = Reason.OUT_OF_MEMORY

Key = ConfigKey
Index = tuple[int, int, int, int]
#: Neighbour steps in (batch, delay, workers) index space, in the order they are tried.
STEPS: tuple[tuple[int, int, int], ...] = ((1, 0, 0), (0, 0, 1), (0, 1, 0), (-1, 0, 0), (0, -1, 0), (0, 0, -1))
#: A verdict's hint axis -> its position in the (batch, delay, workers) index space; `decode` moves along the
#: data paths instead (:func:`decodes_more`), and a hint for an axis the space lacks is ignored.
HINT_AXES = {"batchSize": 0, "maxBatchDelayMs": 1, "workers": 2}
DECODE_HINT = "decode"


def decodes_more(base: DataPath, other: DataPath) -> bool:
    """Whether `other` gives decoding more than `base` does: the device instead of the CPU, or more CPU threads."""
    if other.decode is Decode.DEVICE:
        return base.decode is not Decode.DEVICE
    return base.decode is not Decode.DEVICE and other.decode_threads > base.decode_threads


@dataclass(frozen=True)
class Outcome:
    """A finished trial as the search sees it: its capacity within the SLO, or why there is none.

    `score` is None for a trial that ran but had no level within the SLO (`feasible` True) and for
    one that could not run (`feasible` False, `reason` such as OutOfMemory, NeverReady, Crashed).
    """

    config: TrialConfig
    score: float | None
    feasible: bool = True
    reason: str | None = None
    verdict: Verdict | None = None


def _unguided(outcome: Outcome) -> Outcome:
    return Outcome(outcome.config, outcome.score, outcome.feasible, outcome.reason)


def hinted_steps(verdict: Verdict | None) -> list[tuple[int, int, int]]:
    """The neighbour steps a verdict points at, most direct first (axes outside the lattice left out)."""
    steps = []
    for hint in verdict.hints if verdict is not None else []:
        if hint.axis in HINT_AXES and hint.step:
            step = [0, 0, 0]
            step[HINT_AXES[hint.axis]] = hint.step
            steps.append((step[0], step[1], step[2]))
    return steps


@dataclass
class Proposal:
    """What to run next (at most the slots asked for) and, when nothing is left, why the sweep stops."""

    configs: list[TrialConfig] = field(default_factory=list)
    stop_reason: str | None = None


def pruned_by(history: list[Outcome], config: TrialConfig) -> str | None:
    """Why `config` need not run: an out-of-memory at no more batch and workers, same server and precision."""
    for outcome in history:
        other = outcome.config
        if (
            outcome.reason == OUT_OF_MEMORY
            and other.kind == config.kind
            and other.precision == config.precision
            and other.path.label() == config.path.label()
            and other.form == config.form
            and config.batch_size >= other.batch_size
            and config.workers >= other.workers
            and config.key() != other.key()
        ):
            return f"implied by {OUT_OF_MEMORY} at {other.label()}"
    return None


def _value(outcome: Outcome) -> float:
    """Order of merit: a capacity; then a trial that ran but met no SLO; then one that could not run."""
    if outcome.score is not None:
        return outcome.score
    return -1.0 if outcome.feasible else -2.0


def best(history: list[Outcome]) -> Outcome | None:
    """The trial with the highest capacity within the SLO (the earliest among equals), if any."""
    scored = [o for o in history if o.score is not None]
    return max(scored, key=lambda o: o.score or 0.0) if scored else None


def _patience_spent(sweep: SweepSpec, history: list[Outcome]) -> bool:
    """True when the last `patience` trials did not raise the best by `minImprovement`."""
    record, since = None, 0
    for outcome in history:
        if outcome.score is not None and (record is None or outcome.score > record * (1 + sweep.stop.min_improvement)):
            record, since = outcome.score, 0
        else:
            since += 1
    return since >= sweep.stop.patience


def propose(sweep: SweepSpec, history: list[Outcome], running: list[TrialConfig], slots: int) -> Proposal:
    """Up to `slots` configurations to start now, given the finished `history` and those `running`."""
    servers = kinds(sweep)
    if len(servers) == 1:  # [None] without a kind axis; a kind axis of one server runs on that server
        return _propose(sweep, servers[0], history, running, slots, sweep.max_trials)
    limit, count = sweep.max_trials, len(servers)
    shares = [None if limit is None else limit // count + (i < limit % count) for i in range(count)]
    configs: list[TrialConfig] = []
    reasons: list[str] = []
    for server, share in zip(servers, shares, strict=True):
        mine = [o for o in history if o.config.kind == server]
        busy = [c for c in running if c.kind == server]
        proposal = _propose(sweep, server, mine, busy, slots - len(configs), share)
        configs += proposal.configs
        reasons.append(f"{server}: {proposal.stop_reason}" if proposal.stop_reason else "")
    finished = not configs and not running and all(reasons)
    return Proposal(configs=configs, stop_reason="; ".join(reasons) if finished else None)


def _propose(
    sweep: SweepSpec, kind: ServerKind | None, history: list[Outcome], running: list[TrialConfig], slots: int,
    limit: int | None,
) -> Proposal:  # fmt: skip
    """The proposal on one server's space (`kind`: None without a kind axis), at most `limit` trials."""
    done = {o.config.key() for o in history}
    busy = {c.key() for c in running}
    if limit is not None and len(done) + len(busy) >= limit:
        what = "maxTrials" if kind is None else "its share of maxTrials"
        return Proposal(stop_reason=None if busy else f"{what} ({limit}) reached")
    if slots <= 0:
        return Proposal()
    if sweep.strategy == "search" and history and _patience_spent(sweep, history):
        if best(history) is None:  # nothing to improve on: say that, not "no improvement"
            why = f"none of the {len(history)} trials met the objective (see the Pareto front for the closest)"
        else:
            why = f"no improvement of {sweep.stop.min_improvement:.0%} in the last {sweep.stop.patience} trials"
        return Proposal(stop_reason=None if busy else why)
    room = slots if limit is None else min(slots, limit - len(done) - len(busy))
    if sweep.strategy == "search":
        state = _SearchState(sweep, history if sweep.guided else [_unguided(o) for o in history], kind)
        candidates = state.candidates()
        finished = "converged: the best configuration's neighbours and other precisions were tried"
        if (ceiling := state.at_raw_ceiling()) is not None:
            candidates, finished = ceiling
    else:
        candidates = grid(sweep, kind, every_kind=False)
        skipped = any(c.key() not in done and pruned_by(history, c) for c in candidates)
        finished = "every configuration was tried" + (" or pruned" if skipped else "")
    chosen = [c for c in candidates if c.key() not in done and c.key() not in busy and not pruned_by(history, c)]
    chosen = list({c.key(): c for c in chosen}.values())[: max(room, 0)]
    return Proposal(configs=chosen, stop_reason=finished if not chosen and not busy else None)


class _SearchState:
    """The lattice and the outcomes on it, rebuilt from the history on every call."""

    def __init__(self, sweep: SweepSpec, history: list[Outcome], kind: ServerKind | None) -> None:
        self.batches, self.delays, self.workers = axis_values(sweep, kind)[:3]
        self.kind = kind
        # the categorical coordinate: every precision with every data path and form (those that can run)
        self.precisions = variants(sweep, kind)
        self.variant_keys = [(str(p), path.label(), str(form or "")) for p, path, form in self.precisions]
        self.history = history
        self.by_key = {o.config.key(): o for o in history}

    def config(self, index: Index) -> TrialConfig:
        b, d, w, p = index
        precision, path, form = self.precisions[p]
        return TrialConfig(
            kind=self.kind, batch_size=self.batches[b], max_batch_delay_ms=self.delays[d], workers=self.workers[w],
            precision=precision, data_path=path, form=form,
        )  # fmt: skip

    def index(self, config: TrialConfig) -> Index:
        return (
            self.batches.index(config.batch_size),
            self.delays.index(config.max_batch_delay_ms),
            self.workers.index(config.workers),
            self.variant_keys.index((str(config.precision), config.path.label(), str(config.form or ""))),
        )

    def start(self, precision: int) -> Index:
        return (len(self.batches) // 2, len(self.delays) // 2, 0, precision)

    def homes(self, precision: int) -> list[Index]:
        """The successive best configurations of one precision, in the order the climb found them."""
        chain: list[Index] = []
        record = None
        for outcome in self.history:
            if self.index(outcome.config)[3] != precision:
                continue
            if record is None or _value(outcome) > record:
                record = _value(outcome)
                chain.append(self.index(outcome.config))
        return chain

    def neighbours(self, home: Index, previous: Index | None) -> list[Index]:
        """One step on one axis from `home`: the steps its verdict points at first, then the direction of
        the last successful move, then the rest."""
        steps = list(STEPS)
        first: list[tuple[int, int, int]] = []
        if previous is not None:
            first.append((max(-1, min(1, home[0] - previous[0])), max(-1, min(1, home[1] - previous[1])),
                          max(-1, min(1, home[2] - previous[2]))))  # fmt: skip
        at_home = self.by_key.get(self.config(home).key())
        first = hinted_steps(at_home.verdict if at_home is not None else None) + first
        for step in reversed(first):
            if step in steps:
                steps.remove(step)
                steps.insert(0, step)
        sizes = (len(self.batches), len(self.delays), len(self.workers))
        found = []
        for step in steps:
            moved = tuple(home[i] + step[i] for i in range(3))
            if all(0 <= moved[i] < sizes[i] for i in range(3)):
                found.append((moved[0], moved[1], moved[2], home[3]))
        return found

    def at_raw_ceiling(self) -> tuple[list[TrialConfig], str] | None:
        """When the best configuration serves near the model's raw ceiling: the moves its verdict still
        points at (untried ones), and why the search stops once they are tried."""
        overall = best(self.history)
        if overall is None or overall.verdict is None or overall.verdict.bottleneck != Bottleneck.RAW_CEILING:
            return None
        index = self.index(overall.config)
        sizes = (len(self.batches), len(self.delays), len(self.workers))
        moves = [tuple(index[i] + step[i] for i in range(3)) for step in hinted_steps(overall.verdict)]
        configs = self.form_first(overall, index) + [
            self.config((m[0], m[1], m[2], index[3])) for m in moves if all(0 <= m[i] < sizes[i] for i in range(3))
        ]
        ratio = overall.verdict.served_over_raw
        figure = f" ({ratio:.0%} of the model alone at its formed batch)" if ratio is not None else ""
        return (
            configs,
            f"at the model's raw ceiling: {overall.config.label()} serves near what the model alone does{figure}",
        )

    def candidates(self) -> list[TrialConfig]:
        """Every configuration worth trying now, most promising first (the caller drops done ones)."""
        starts = [self.config(self.start(p)) for p in range(len(self.precisions))]
        if any(c.key() not in self.by_key for c in starts):
            return starts  # screening first
        overall = best(self.history)
        top = overall.score if overall is not None else None
        bests = {p: max((_value(o) for o in self.history if self.index(o.config)[3] == p), default=-2.0)
                 for p in range(len(self.precisions))}  # fmt: skip
        live = [p for p in range(len(self.precisions)) if top is None or bests[p] >= SCREEN_RATIO * top]
        ordered: list[TrialConfig] = []
        for precision in sorted(live, key=lambda p: -bests[p]):
            chain = self.homes(precision)
            home, previous = chain[-1], (chain[-2] if len(chain) > 1 else None)
            ordered += [self.config(i) for i in self.neighbours(home, previous)]
        if overall is not None:  # then the best configuration at the other precisions: a screening check
            b, d, w, p = self.index(overall.config)
            ordered += [self.config((b, d, w, q)) for q in range(len(self.precisions)) if q != p]
            ordered = self.form_first(overall, (b, d, w, p)) + self.decode_first(overall, (b, d, w, p)) + ordered
        return ordered

    def form_first(self, overall: Outcome, index: Index) -> list[TrialConfig]:
        """When the best's verdict names a faster form (near the raw ceiling, another form alone runs faster):
        the same configuration in that form, at the same precision and data path, before anything else."""
        wanted = [h.value for h in (overall.verdict.hints if overall.verdict is not None else []) if h.axis == "form"]
        b, d, w, p = index
        precision, path, _ = self.precisions[p]
        return [
            self.config((b, d, w, q))
            for q, (other_precision, other_path, other_form) in enumerate(self.precisions)
            if other_precision == precision and other_path.label() == path.label() and str(other_form) in wanted
        ]

    def decode_first(self, overall: Outcome, index: Index) -> list[TrialConfig]:
        """When the best's verdict says decoding limits it: the same configuration with decoding given more
        (on the device, or more threads) at the same precision, before anything else."""
        if overall.verdict is None or not any(h.axis == DECODE_HINT and h.step > 0 for h in overall.verdict.hints):
            return []
        b, d, w, p = index
        precision, path, form = self.precisions[p]
        return [
            self.config((b, d, w, q))
            for q, (other_precision, other_path, other_form) in enumerate(self.precisions)
            if other_precision == precision and other_form == form and decodes_more(path, other_path)
        ]
