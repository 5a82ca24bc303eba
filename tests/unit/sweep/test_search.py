"""The sweep's search against the grid on synthetic response surfaces (no server: pure functions).

Each surface maps a configuration to its capacity within a 100 ms p99 SLO (None when no load level
meets it) or to an infeasible trial. The bar from the issue: within 5 % of the grid's best with at
most 40 % of the grid's trials, on a 4-axis space.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from servinglab.api import SweepSpec, TrialConfig, grid
from servinglab.sweep.search import OUT_OF_MEMORY, Outcome, best, propose, pruned_by
from support import manifests

Surface = Callable[[TrialConfig], Outcome]
SPEED = {"fp32": 1.0, "tf32": 1.3, "fp16": 2.1, "bf16": 1.9}


def sweep(strategy: str = "search", **extra: object) -> SweepSpec:
    return SweepSpec.model_validate({
        "template": {"model": {"name": "tiny"}, "slo": {"p99LatencyMs": 100}},
        "strategy": strategy,
        "space": {
            "batchSize": {"min": 1, "max": 128},
            "maxBatchDelayMs": {"values": [1, 5, 10, 20, 50]},
            "workers": {"values": [1, 2, 3, 4]},
            "precision": {"values": ["fp32", "fp16"]},
        },
        **extra,
    })  # fmt: skip


def monotone(config: TrialConfig) -> Outcome:
    """More batch, workers and delay always help a little less: the best is the largest corner."""
    rps = (
        1000 * SPEED[config.precision] * (1 - math.exp(-config.batch_size / 24)) * (1 + 0.15 * math.log(config.workers))
        * (1 + 0.03 * math.log(config.max_batch_delay_ms))
    )  # fmt: skip
    return Outcome(config, rps)


def interior(config: TrialConfig) -> Outcome:
    """Batching helps until p99 (batch x delay x queue) breaks the SLO; two workers beat one, more thrash."""
    speed = SPEED[config.precision]
    service_ms = (4 + 0.9 * config.batch_size) / speed
    p99 = service_ms * 2.2 + config.max_batch_delay_ms * 1.1 + 6 * abs(config.workers - 2)
    if p99 > 100:
        return Outcome(config, None)
    rps = 1000 * config.batch_size / service_ms * {1: 0.7, 2: 1.0, 3: 0.85, 4: 0.6}[config.workers]
    return Outcome(config, rps * (1 - 0.002 * config.max_batch_delay_ms))


def memory_bound(config: TrialConfig) -> Outcome:
    """The monotone surface on a GPU that runs out of memory past batch x workers x bytes."""
    bytes_per_sample = {"fp32": 4, "fp16": 2}[config.precision]
    if config.batch_size * config.workers * bytes_per_sample > 512:
        return Outcome(config, None, feasible=False, reason=OUT_OF_MEMORY)
    return monotone(config)


def run(spec: SweepSpec, surface: Surface, slots: int = 1) -> tuple[list[Outcome], str]:
    """Drive the strategy to its end; `slots` trials may be outstanding at once (finished oldest first)."""
    history: list[Outcome] = []
    running: list[TrialConfig] = []
    for _ in range(10_000):
        proposal = propose(spec, history, running, slots - len(running))
        running += proposal.configs
        if not running:
            assert proposal.stop_reason is not None
            return history, proposal.stop_reason
        history.append(surface(running.pop(0)))
    raise AssertionError("the strategy never stopped")


@pytest.mark.parametrize("surface", [monotone, interior, memory_bound], ids=lambda s: s.__name__)
@pytest.mark.parametrize("slots", [1, 2])
def test_search_finds_the_grids_best_within_5_percent_with_at_most_40_percent_of_its_trials(
    surface: Surface, slots: int
) -> None:
    grid_history, _grid_stop = run(sweep("grid"), surface)
    search_history, search_stop = run(sweep("search"), surface, slots)
    grid_best, search_best = best(grid_history), best(search_history)
    assert grid_best is not None and search_best is not None and grid_best.score and search_best.score
    size = len(grid(sweep("grid")))
    assert size == 320 and len({o.config.key() for o in search_history}) == len(search_history)  # none twice
    assert search_best.score >= 0.95 * grid_best.score, (search_best, grid_best)
    assert len(search_history) <= 0.4 * size, len(search_history)
    assert search_stop.startswith(("converged", "no improvement"))
    print(f"{surface.__name__} slots={slots}: search {len(search_history)} trials, best {search_best.score:.0f} "
          f"({search_best.config.label()}) vs grid {len(grid_history)} trials, best {grid_best.score:.0f}")  # fmt: skip


def test_an_out_of_memory_prunes_larger_batches_and_workers_at_that_precision_in_the_grid_too() -> None:
    history, stop = run(sweep("grid"), memory_bound)
    oom = [o for o in history if o.reason == OUT_OF_MEMORY]
    assert oom and "or pruned" in stop
    # each configuration beyond the memory boundary either ran out of memory or was never run
    ran = {o.config.key() for o in history}
    skipped = [c for c in grid(sweep("grid")) if c.key() not in ran]
    assert skipped and all(pruned_by(history, c) for c in skipped)
    assert all(memory_bound(c).reason == OUT_OF_MEMORY for c in skipped)  # pruning never loses a feasible one
    fp16 = TrialConfig(batch_size=128, max_batch_delay_ms=1, workers=1, precision="fp16")
    assert pruned_by(history, fp16) is None  # another precision is not implied


def test_patience_and_max_trials_stop_the_search_and_say_why() -> None:
    _, stop = run(sweep("search", maxTrials=5), monotone)
    assert stop == "maxTrials (5) reached"
    flat = lambda config: Outcome(config, 100.0)  # noqa: E731 - nothing ever improves
    history, stop = run(sweep("search", stop={"patience": 4}), flat)
    assert stop == "no improvement of 2% in the last 4 trials" and len(history) == 5
    infeasible = lambda config: Outcome(config, None)  # noqa: E731 - nothing meets the SLO (seen on an H100)
    history, stop = run(sweep("search", stop={"patience": 4}), infeasible)
    assert stop == "none of the 4 trials met the objective (see the Pareto front for the closest)"


def test_the_search_is_a_function_of_its_history_so_a_restart_resumes_it() -> None:
    spec = sweep("search")
    history, _ = run(spec, interior)
    # replaying any prefix proposes exactly the trial that followed it
    for cut in range(len(history) - 1):
        assert propose(spec, history[:cut], [], 1).configs == [history[cut].config]


def test_a_list_sweep_runs_exactly_its_configurations_in_order() -> None:
    configs = [
        {"batchSize": 1, "maxBatchDelayMs": 10, "workers": 1, "precision": "fp32"},
        {"batchSize": 64, "maxBatchDelayMs": 10, "workers": 4, "precision": "fp16"},
    ]
    spec = SweepSpec.model_validate(
        {"template": {"model": {"name": "tiny"}}, "strategy": "list", "configurations": configs}
    )
    history, stop = run(spec, monotone)
    assert [o.config.label() for o in history] == ["b1-d10-w1-fp32", "b64-d10-w4-fp16"]
    assert stop == "every configuration was tried"


# -- a kind axis: each server its own space -------------------------------------------------------------


def two_servers(strategy: str = "search", **extra: object) -> SweepSpec:
    return SweepSpec.model_validate({
        "template": {"model": {"name": "tiny"}, "slo": {"p99LatencyMs": 100}},
        "strategy": strategy,
        "space": {
            "kind": {"values": ["torchserve", "litserve"]},
            "batchSize": {"min": 1, "max": 64},
            "maxBatchDelayMs": {"values": [1, 5, 20]},
            "workers": {"values": [1, 2]},
            "precision": {"values": ["fp32", "fp16"]},
            "perKind": {"litserve": {"workers": {"values": [1, 2, 4]}}},
        },
        **extra,
    })  # fmt: skip


def servers_surface(config: TrialConfig) -> Outcome:
    """Two servers whose knobs peak in different places, one far slower than the other everywhere: TorchServe
    peaks at batch 16 / 2 workers, LitServe (a third of its speed) at batch 64 / 4 workers."""
    if config.kind == "torchserve":
        rps = 3000 * SPEED[config.precision] * math.exp(-((math.log2(config.batch_size) - 4) ** 2) / 4)
        return Outcome(config, rps * {1: 0.8, 2: 1.0}[config.workers])
    rps = 1000 * SPEED[config.precision] * math.exp(-((math.log2(config.batch_size) - 6) ** 2) / 8)
    return Outcome(config, rps * {1: 0.5, 2: 0.8, 4: 1.0}[config.workers])


def test_a_kind_axis_searches_each_server_to_its_own_best_even_the_slower_one() -> None:
    spec = two_servers(stop={"patience": 6})
    history, reason = run(spec, servers_surface)
    every = [servers_surface(config) for config in grid(spec)]
    for server in ("torchserve", "litserve"):
        mine = [o for o in history if o.config.kind == server]
        found, truth = best(mine), best([o for o in every if o.config.kind == server])
        assert found is not None and truth is not None
        # the slower server is climbed to its own best although it never beats the faster one
        assert found.score is not None and truth.score is not None and found.score >= 0.95 * truth.score, server
    assert [o.config.kind for o in history] == sorted((o.config.kind for o in history), key=["torchserve",
            "litserve"].index), "servers run one after the other, in the axis' order"  # fmt: skip
    assert reason.startswith("torchserve: ") and "; litserve: " in reason
    assert len(history) < 0.5 * len(every)


def test_each_server_has_its_own_axes_labels_and_share_of_max_trials() -> None:
    spec = two_servers("grid", maxTrials=9)
    configs = grid(spec)
    assert {c.workers for c in configs if c.kind == "litserve"} == {1, 2, 4}
    assert {c.workers for c in configs if c.kind == "torchserve"} == {1, 2}
    assert len(configs) == 7 * 3 * 2 * 2 + 7 * 3 * 3 * 2
    assert configs[0].label() == "torchserve-b1-d1-w1-fp32" and configs[-1].label() == "litserve-b64-d20-w4-fp16"
    history, reason = run(spec, servers_surface)
    assert [o.config.kind for o in history].count("torchserve") == 5  # 9 trials: 5 and 4
    assert [o.config.kind for o in history].count("litserve") == 4
    assert "its share of maxTrials (5) reached" in reason and "its share of maxTrials (4) reached" in reason


def test_an_out_of_memory_prunes_only_on_the_server_that_ran_out() -> None:
    spec = two_servers("grid")
    oom = Outcome(TrialConfig(kind="litserve", batch_size=8, max_batch_delay_ms=1, workers=1, precision="fp32"),
                  None, feasible=False, reason=OUT_OF_MEMORY)  # fmt: skip
    larger = {"batch_size": 16, "max_batch_delay_ms": 1, "workers": 2, "precision": "fp32"}
    assert pruned_by([oom], TrialConfig(kind="litserve", **larger)) is not None
    assert pruned_by([oom], TrialConfig(kind="torchserve", **larger)) is None
    assert not any(c.kind == "torchserve" and pruned_by([oom], c) for c in grid(spec))


def test_a_kind_axis_is_validated_with_the_rest_of_the_space() -> None:
    from servinglab.api import SpecError, parse_sweep

    document = manifests.sweep("s", template={"model": {"name": "tiny"}}, space={
        "kind": {"values": ["litserve", "litserve"]},
        "perKind": {"tensorrt": {"workers": {"values": [1]}}, "litserve": {"workers": {"values": [0]}}},
    })  # fmt: skip
    with pytest.raises(SpecError) as raised:
        parse_sweep(document)
    message = str(raised.value)
    assert "spec.space.perKind.litserve.workers.values[0]" in message
    assert "repeat a server" in message
    document["spec"]["space"] = {"kind": {"values": ["litserve"]}, "perKind": {"torchserve": {}}}  # type: ignore[index]
    with pytest.raises(SpecError, match=r"perKind\.torchserve: not a server of the kind axis"):
        parse_sweep(document)
