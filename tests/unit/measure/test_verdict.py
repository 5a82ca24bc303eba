"""The bottleneck verdict on tables of figures (pure): each rule, the order they are tried in, what each
points the search at, and the figures it is read from (time split, worker load, device, batch formation).

The same verdicts on a real TorchServe, where the truth is built in, are in
tests/integration/test_verdicts_on_torchserve.py; the figures below are of the kind those runs measured
on this 2-core machine.
"""

from __future__ import annotations

from typing import Any

import pytest

from servinglab.api.ceiling import Ceiling, RawRow
from servinglab.api.figures import GpuFigures
from servinglab.api.results import LevelResult, ServerSettings
from servinglab.api.verdicts import Bottleneck, CpuFigures
from servinglab.measure.verdict import judge

SETTINGS = ServerSettings(batch_size=8, max_batch_delay_ms=5, workers=1)
DELAY_50 = ServerSettings(batch_size=8, max_batch_delay_ms=50, workers=1)
DELAY_100 = ServerSettings(batch_size=8, max_batch_delay_ms=100, workers=1)


def level(
    client: float = 100.0, server: float = 98.0, queue: float = 40.0, pre: float = 2.0, infer: float = 50.0,
    post: float = 1.0, batch: float = 8.0, batches: float = 30.0, window: float = 2.0, rps: float = 80.0,
    users: int | None = 8, **extra: Any,
) -> LevelResult:  # fmt: skip
    """One level: client latency and the server's breakdown (per request / per batch, ms)."""
    return LevelResult.model_validate({
        "concurrency": users, "rateRps": None if users is not None else rps, "throughputRps": rps,
        "requests": int(rps * window), "errors": 0, "windowSeconds": window,
        "latencyMs": {"mean": client, "p99": client},
        "generator": {"cpuPercent": 1.0, "sendGapMs": {"p50": 0.07, "p99": 0.3}, "saturated": False},
        "server": {"queueMsMean": queue, "serverLatencyMsMean": server, "preprocessMsPerBatch": pre,
                   "inferenceMsPerBatch": infer, "postprocessMsPerBatch": post, "meanBatchSize": batch,
                   "batches": batches, "serverRequests": batch * batches},
        **extra,
    })  # fmt: skip


COMPUTING = {"cpu": CpuFigures(cores_busy=0.3, cores_wanted=1.6, cores=2)}
WAITING = {"cpu": CpuFigures(cores_busy=0.02, cores_wanted=0.08, cores=2)}

#: One worker whose handler counted 72 % of a 3 s window (26.9 ms a batch of 4 of 4, 80.5 batches) on busy cores.
HANDED_OFF: dict[str, Any] = {"pre": 3.8, "infer": 22.9, "post": 0.2, "batch": 4.0, "batches": 80.5, "window": 3.0,
                              "rps": 107.0, "cpu": CpuFigures(cores_busy=1.2, cores_wanted=1.7, cores=2)}  # fmt: skip

CASES = [
    # (name, level, settings, expected verdict, first hint axis)
    (
        "the generator says it limited",
        level(generator={"cpuPercent": 97.0, "saturated": True, "reason": "generator CPU 97% >= 85%"}, **COMPUTING),
        SETTINGS,
        Bottleneck.GENERATOR,
        None,
    ),
    (
        "an open loop that dropped its sends",
        level(users=None, openLoop={"sentRps": 50, "lateSends": 10, "droppedSends": 40}),
        SETTINGS,
        Bottleneck.GENERATOR,
        None,
    ),
    # busy worker (50 ms x 30 batches / 2 s = 0.80), preprocess the largest stage
    ("preprocess dominates", level(pre=40.0, infer=12.0, batches=30.0), SETTINGS, Bottleneck.PREPROCESS, "decode"),
    (
        "postprocess dominates",
        level(pre=2.0, infer=10.0, post=45.0, batches=30.0),
        SETTINGS,
        Bottleneck.POSTPROCESS,
        "workers",
    ),
    # the forward pass dominates a busy worker: the device decides
    ("the forward pass on a computing CPU", level(**COMPUTING), SETTINGS, Bottleneck.COMPUTE, "batchSize"),
    ("the forward pass waits on a device with room", level(**WAITING), SETTINGS, Bottleneck.QUEUE, "workers"),
    ("a busy GPU", level(gpu=GpuFigures(utilization_avg_percent=93)), SETTINGS, Bottleneck.COMPUTE, "batchSize"),
    ("a GPU with room", level(gpu=GpuFigures(utilization_avg_percent=21)), SETTINGS, Bottleneck.QUEUE, "workers"),
    ("no device figures: the forward pass is the limit", level(), SETTINGS, Bottleneck.COMPUTE, "batchSize"),
    # batches of 4 of 8 gathered by the delay (80 rps x 50 ms = 4 arrivals): a longer delay first
    (
        "the delay forms the batches of a busy model",
        level(batch=4.0, batches=30.0, queue=60.0, users=64, **COMPUTING),
        ServerSettings(batch_size=8, max_batch_delay_ms=50, workers=1),
        Bottleneck.COMPUTE,
        "maxBatchDelayMs",
    ),
    # a contended host (CI's, beside the cluster suite): the handler counted 72 % of the window, the rest went to
    # the frontend's hand-offs between batches (72 - 35 - 26.9 = 10.1 ms of each request in the server): the
    # workers' cycle filled the window, so they were the limit, not the load
    (
        "workers under the busy mark whose hand-offs fill the window",
        level(client=75.0, server=72.0, queue=35.0, **HANDED_OFF),
        ServerSettings(batch_size=4, max_batch_delay_ms=5, workers=1),
        Bottleneck.COMPUTE,
        "batchSize",
    ),
    # the same handler share with no hand-off time: the workers idled 28 % of the window, the load had room
    (
        "workers under the busy mark with no hand-offs",
        level(client=35.0, server=33.0, queue=6.0, **HANDED_OFF),
        ServerSettings(batch_size=4, max_batch_delay_ms=5, workers=1),
        Bottleneck.UNDERLOADED,
        None,
    ),
    # an open loop at 60 % of one worker queues by chance (Poisson arrivals), batches of one are always "full":
    # the workers had room, whatever the queue
    (
        "an open loop queues by chance at 60 % of a worker",
        level(client=40.0, server=38.0, queue=15.0, infer=21.0, batch=1.0, batches=50.0, rps=25.0, users=None),
        ServerSettings(batch_size=1, max_batch_delay_ms=1, workers=1),
        Bottleneck.UNDERLOADED,
        None,
    ),
    # an idle worker: requests wait on the batch timer
    (
        "a long delay at low load",
        level(client=160.0, server=158.0, queue=101.0, infer=40.0, batch=1.0, batches=12.0, rps=6.0, users=1),
        ServerSettings(batch_size=8, max_batch_delay_ms=100, workers=1),
        Bottleneck.BATCH_DELAY,
        "maxBatchDelayMs",
    ),
    (
        "the time is outside the server",
        level(client=100.0, server=30.0, queue=2.0, infer=20.0, batches=10.0),
        SETTINGS,
        Bottleneck.FRONTEND,
        None,
    ),
    (
        "one user keeps a worker busy with batches of one",
        level(client=85.0, server=83.0, queue=2.6, infer=60.0, batch=1.0, batches=20.0, rps=10.0, users=1, **COMPUTING),
        SETTINGS,
        Bottleneck.UNDERLOADED,
        None,
    ),
    (
        "an idle server",
        level(client=12.0, server=11.0, queue=1.0, infer=8.0, batch=1.0, batches=20.0, users=1),
        SETTINGS,
        Bottleneck.UNDERLOADED,
        None,
    ),
    (
        "no breakdown",
        LevelResult(concurrency=4, throughput_rps=10.0, requests=20, errors=0),
        SETTINGS,
        Bottleneck.UNKNOWN,
        None,
    ),
]


@pytest.mark.parametrize(("name", "measured", "settings", "expected", "axis"), CASES, ids=[c[0] for c in CASES])
def test_each_rule_on_its_figures(
    name: str, measured: LevelResult, settings: ServerSettings, expected: Bottleneck, axis: str | None
) -> None:
    verdict = judge(measured, settings)
    assert verdict.bottleneck == expected, (name, verdict.because)
    assert (verdict.hints[0].axis if verdict.hints else None) == axis
    assert verdict.because and verdict.next


def test_the_parts_are_the_figures_a_person_checks_it_by() -> None:
    verdict = judge(level(client=100.0, server=98.0, queue=40.0, pre=2.0, infer=50.0, post=1.0, **COMPUTING), SETTINGS)
    split, workers, device, batch = verdict.time_ms, verdict.workers, verdict.device, verdict.batch
    assert split is not None and workers is not None and device is not None and batch is not None
    assert split.network_frontend_ms == 2.0  # client - server
    assert split.batching_ms == 5.0  # server - queue - handler (98 - 40 - 53)
    assert workers.busy_fraction == pytest.approx(53 * 30 / 2000)  # handler x batches / (workers x window)
    assert device.kind == "cpu" and device.busy_fraction == 0.8  # 1.6 cores wanted of 2
    assert device.compute_per_busy_second == pytest.approx(1.6 / 0.795, abs=1e-3)
    assert batch.formed_by == "maximum" and batch.fill == 1.0 and "a larger batch may serve more" in (batch.note or "")
    assert "53" not in verdict.because and "busy 80%" in verdict.because  # figures, rounded for people


def test_near_the_raw_ceiling_wins_over_what_the_server_adds_and_points_at_a_larger_batch_where_faster() -> None:
    raw = Ceiling(flops_per_inference=1, raw_table=[RawRow(batch_size=8, throughput_rps=90.0),
                                                     RawRow(batch_size=16, throughput_rps=140.0)],
                  raw_best_batch_size=16)  # fmt: skip
    verdict = judge(level(**COMPUTING), SETTINGS, raw)
    assert verdict.bottleneck == Bottleneck.RAW_CEILING and verdict.served_over_raw == pytest.approx(80 / 90, 1e-3)
    assert [h.axis for h in verdict.hints] == ["batchSize"]
    far = Ceiling(flops_per_inference=1, raw_table=[RawRow(batch_size=8, throughput_rps=400.0)])
    assert judge(level(**COMPUTING), SETTINGS, far).bottleneck == Bottleneck.COMPUTE


def test_a_generator_that_limited_comes_before_everything_the_server_says() -> None:
    saturated = level(pre=40.0, infer=12.0, generator={"cpuPercent": 99.0, "saturated": True, "reason": "CPU"})
    assert judge(saturated, SETTINGS).bottleneck == Bottleneck.GENERATOR


def test_batch_formation_names_what_sets_the_batch() -> None:
    delay = ServerSettings(batch_size=16, max_batch_delay_ms=5, workers=1)

    def formed_by(measured: LevelResult) -> str | None:
        batch = judge(measured, delay).batch
        return batch.formed_by if batch is not None else None

    assert formed_by(level(batch=16.0)) == "maximum"
    assert formed_by(level(batch=4.0, users=4)) == "load"  # every user's request in one batch
    assert formed_by(level(batch=6.0, users=64, rps=80.0)) == "queue"  # 0.4 arrive within 5 ms: queued ones
    assert formed_by(level(batch=6.0, users=64, rps=1000.0)) == "delay"  # 5 arrive within 5 ms


def test_a_document_judges_every_level_and_the_status_keeps_the_compact_verdict() -> None:
    from servinglab.api import ExperimentSpec
    from servinglab.api.results import Runtime
    from servinglab.measure.document import experiment_results

    spec = ExperimentSpec.model_validate({"model": {"name": "tiny"}, "server": {"batchSize": 8, "workers": 1}})
    document = experiment_results("x", spec, [level(**COMPUTING), level(pre=40.0, infer=12.0)],
                                  runtime=Runtime(mode="local"))  # fmt: skip
    verdicts = [lvl.verdict for lvl in document.results]
    assert [v.bottleneck for v in verdicts if v is not None] == [Bottleneck.COMPUTE, Bottleneck.PREPROCESS]
    compact = document.results[0].compact().verdict
    assert compact is not None and compact.bottleneck == Bottleneck.COMPUTE and compact.time_ms is None
    assert compact.hints and compact.because
