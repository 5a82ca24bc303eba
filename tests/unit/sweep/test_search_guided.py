"""The search guided by each trial's verdict against the same search without it, on synthetic servers whose
trials are judged by the real verdict (tests/sweepsurfaces.py): how many trials each takes to reach the
grid's best, and where each stops. The same comparison on the tiny model is benchmarks/sweep_guided.py.
"""

from __future__ import annotations

import pytest

from servinglab.api import SweepSpec, TrialConfig
from servinglab.api.verdicts import Bottleneck, Verdict, VerdictHint
from servinglab.sweep.search import Outcome, best, propose
from sweepsurfaces import SERVERS, Server


def sweep(strategy: str = "search", guided: bool = True) -> SweepSpec:
    return SweepSpec.model_validate({
        "template": {"model": {"name": "tiny"}, "slo": {"p99LatencyMs": 200}},
        "strategy": strategy, "guided": guided,
        "space": {"batchSize": {"min": 1, "max": 64}, "maxBatchDelayMs": {"values": [1, 2, 5, 10, 20, 50]},
                  "workers": {"min": 1, "max": 8, "scale": "linear"}},
    })  # fmt: skip


def run(spec: SweepSpec, server: Server) -> tuple[list[Outcome], str]:
    history: list[Outcome] = []
    for _ in range(1000):
        proposal = propose(spec, history, [], 1)
        if not proposal.configs:
            assert proposal.stop_reason is not None
            return history, proposal.stop_reason
        history.append(server.outcome(proposal.configs[0]))
    raise AssertionError("never stopped")


def trials_to(history: list[Outcome], target: float) -> int | None:
    """1-based index of the first trial within 2 % of `target` (None: never)."""
    return next((i + 1 for i, o in enumerate(history) if o.score is not None and o.score >= 0.98 * target), None)


@pytest.mark.parametrize("server", SERVERS, ids=[s.name for s in SERVERS])
def test_the_guided_search_finds_as_much_in_fewer_trials_and_reaches_the_grids_best_no_later(server: Server) -> None:
    grid, _ = run(sweep("grid"), server)
    top = best(grid)
    guided, unguided = run(sweep(), server)[0], run(sweep(guided=False), server)[0]
    found, found_unguided = best(guided), best(unguided)
    assert top is not None and top.score and found is not None and found_unguided is not None
    to_guided, to_unguided = trials_to(guided, top.score), trials_to(unguided, top.score)
    print(f"{server.name}: grid best {top.score:.0f} rps ({top.config.label()}, {len(grid)} trials); guided "
          f"{found.score:.0f} in {len(guided)} trials (grid's best after {to_guided}), unguided "
          f"{found_unguided.score:.0f} in {len(unguided)} (after {to_unguided})")  # fmt: skip
    assert (found.score or 0) >= (found_unguided.score or 0) and len(guided) <= len(unguided)
    if to_unguided is not None:
        assert to_guided is not None and to_guided <= to_unguided


def test_the_guided_search_reaches_the_grids_best_on_more_surfaces() -> None:
    reached = {True: 0, False: 0}
    for server in SERVERS:
        top = best(run(sweep("grid"), server)[0])
        assert top is not None and top.score is not None
        for guided in (True, False):
            reached[guided] += trials_to(run(sweep(guided=guided), server)[0], top.score) is not None
    assert reached[True] >= len(SERVERS) // 2 and reached[True] > reached[False], reached


def near_ceiling(config: TrialConfig) -> Outcome:
    """A server already at the model's raw ceiling at batch 4 and above: the search stops there."""
    raw = config.batch_size >= 4
    verdict = Verdict(bottleneck=Bottleneck.RAW_CEILING if raw else Bottleneck.COMPUTE, because="-", next="-",
                      served_over_raw=0.93 if raw else 0.5)  # fmt: skip
    return Outcome(config, 100.0 * min(config.batch_size, 4) + config.workers, verdict=verdict)


def test_the_search_stops_at_the_raw_ceiling_and_says_so() -> None:
    history: list[Outcome] = []
    for _ in range(200):
        proposal = propose(sweep(), history, [], 1)
        if not proposal.configs:
            break
        history.append(near_ceiling(proposal.configs[0]))
    assert proposal.stop_reason is not None and proposal.stop_reason.startswith("at the model's raw ceiling"), (
        proposal.stop_reason
    )
    unguided = run(sweep(guided=False), Server("-", 1, 1, 1, 1, 1))  # the fixed order, for the count
    assert len(history) < len(unguided[0])


def test_a_decode_bound_best_tries_more_decoding_next() -> None:
    """A preprocess-bound best (its verdict: give decoding more) is tried next with more decode threads at
    the same batch, delay and workers, before any neighbour on those axes."""
    spec = SweepSpec.model_validate({
        "template": {"model": {"name": "tiny"}, "slo": {"p99LatencyMs": 200}},
        "space": {"batchSize": {"values": [4, 8, 16]}, "workers": {"values": [1, 2]},
                  "decodeThreads": {"values": [1, 4]}},
    })  # fmt: skip
    decode_bound = Verdict(bottleneck=Bottleneck.PREPROCESS, because="-", next="-",
                           hints=[VerdictHint(axis="decode", step=1), VerdictHint(axis="workers", step=1)])  # fmt: skip
    history = [Outcome(config, 50.0) for config in propose(spec, [], [], 10).configs]  # the screening
    assert sorted(o.config.path.decode_threads for o in history) == [1, 4]
    screened = next(o.config for o in history if o.config.path.decode_threads == 1)
    climbed = screened.model_copy(update={"batch_size": 16})  # one thread, a larger batch: the best so far
    history.append(Outcome(climbed, 100.0, verdict=decode_bound))
    (first,) = propose(spec, history, [], 1).configs
    assert (first.batch_size, first.workers, first.path.decode_threads) == (16, climbed.workers, 4)
    unguided = propose(spec.model_copy(update={"guided": False}), history, [], 1).configs[0]
    assert unguided.path.decode_threads == 1  # without the verdict: a neighbour on batch, delay or workers
