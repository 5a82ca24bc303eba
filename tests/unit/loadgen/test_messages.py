"""What generators and their coordinator exchange (servinglab.loadgen.messages), over a real
authenticated channel: every value arrives exactly as it was sent, and a message that is not what the
protocol expects at that point is refused with a message naming the field. (A plan crossing whole,
payloads and all, is checked where Locust may load: tests/integration/test_generator_coordination.py.)"""

from __future__ import annotations

import dataclasses
import random
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from servinglab.api import GeneratorLimits, ShapeSpec
from servinglab.api.figures import OpenLoopFigures, PhaseFigures, Stability
from servinglab.loadgen import messages, shapes, wire
from servinglab.loadgen.level_message import LevelMessage
from servinglab.loadgen.stats import LevelStats, Sample, generator_verdict, summarise

KEY = bytes(range(32))


@pytest.fixture()
def channels() -> Iterator[tuple[wire.Channel, wire.Channel, ThreadPoolExecutor]]:
    """(coordinator, generator, a thread to send from: a socket pair holds little)."""
    left, right = socket.socketpair()
    with ThreadPoolExecutor(1) as executor, left, right:
        joined = executor.submit(wire.join, right, KEY)
        coordinator = wire.accept(left, KEY)
        yield coordinator, joined.result(timeout=10), executor


def samples(count: int, seed: int = 1) -> list[Sample]:
    rng = random.Random(seed)
    kinds = [None] * 20 + ["timeout", "http_503", "connection:ConnectionResetError"]
    return [Sample(1.8e9 + i * 0.001 + rng.random() / 7, rng.lognormvariate(3, 1), rng.choice(kinds))
            for i in range(count)]  # fmt: skip


def test_samples_arrive_exactly_in_batches(channels: Any) -> None:
    coordinator, generator, executor = channels
    sent = samples(2 * messages.SAMPLES_PER_MESSAGE + 7)
    for batch in (sent, []):
        sending = executor.submit(messages.send_samples, generator, batch)
        assert messages.receive_samples(coordinator) == batch  # floats bit for bit, errors where they were
        sending.result()


def test_a_level_arrives_with_its_figures_and_samples(channels: Any) -> None:
    coordinator, generator, executor = channels
    stats = summarise(4, samples(5000))
    stats = dataclasses.replace(
        stats, generator=generator_verdict(42.5, [0.25, 3.0], GeneratorLimits(), 20.0), rate_rps=None,
        stability=Stability(stable=None, windows=[], reason="1 window(s), 3 needed"),
        open_loop=OpenLoopFigures(offered_rps=50.0, sent_rps=49.5, late_sends=2, dropped_sends=0),
        phases=[PhaseFigures(name="step 1", seconds=2.0, requests=3, errors=0, throughput_rps=1.5)],
    )  # fmt: skip
    executor.submit(messages.send_done, generator, stats)
    received = messages.receive_done(coordinator)
    assert received == stats and received.samples == stats.samples
    assert [getattr(received, f.name) for f in dataclasses.fields(LevelStats)] == [
        getattr(stats, f.name) for f in dataclasses.fields(LevelStats)
    ]


def test_orders_arrive_as_given(channels: Any) -> None:
    coordinator, generator, _ = channels
    burst = ShapeSpec.model_validate({"burst": {"baseRps": 20, "burstRps": 80, "periodSeconds": 4, "burstSeconds": 1,
                                                "durationSeconds": 8}})  # fmt: skip
    schedule = shapes.build(burst, 1.0, "poisson", 7).share(1, 3)
    trace = dataclasses.replace(schedule, payload_indices=tuple(range(len(schedule.offsets))), kind="trace")
    steps = shapes.Schedule((), 1.0, 4.0, (shapes.Phase("step 1: 3 users", 0.0, 2.0, 0.0, 3),), kind="step")
    for share in (5, 0, 33.25, schedule, trace, steps):
        coordinator.send(messages.level(share, 3, 1.8e9 + 0.125, 1.5, 10.0))
        received = messages.read_level(generator.recv(timeout_seconds=5))
        assert received == (share, 3, 1.8e9 + 0.125, 1.5, 10.0)
        assert type(received[0]) is type(share)
    coordinator.send(messages.extend(2.5))
    assert messages.read_extend(generator.recv(timeout_seconds=5)) == 2.5
    generator.send(messages.clock(1.8e9 + 1 / 3))
    assert messages.read_clock(coordinator.recv(timeout_seconds=5)) == 1.8e9 + 1 / 3


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ({"kind": "reboot"}, "expected a 'extend' message, got 'reboot'"),
        ({"kind": "extend"}, "'seconds' is missing"),
        ({"kind": "extend", "seconds": "5"}, "'seconds' is missing or not int or float"),
        ({"kind": "extend", "seconds": True}, "'seconds' is missing or not int or float"),
        ({"kind": "extend", "seconds": 10**400}, "'seconds' is not a finite number"),
        ({"kind": "extend", "seconds": float("inf")}, "'seconds' is not a finite number"),
    ],
)
def test_a_malformed_order_is_refused_naming_the_field(message: dict[str, Any], problem: str) -> None:
    with pytest.raises(messages.MessageError) as raised:
        messages.read_extend(message)
    assert problem in str(raised.value)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"sentAt": "not base64!"}, "'sentAt' is not base64"),
        ({"sentAt": "AAAA"}, "'sentAt' is not a whole number of values"),
        ({"latencyMs": "AAAAAAAA+H8="}, "'latencyMs' holds a value that is not a finite number"),  # NaN
        ({"errors": [[5, "timeout"]]}, "an error is not [sample index, kind]"),  # past the batch
        ({"errors": [[0, "x" * 201]]}, "an error is not [sample index, kind]"),
        ({"last": 1}, "'last' is missing or not bool"),
    ],
)
def test_malformed_samples_are_refused(channels: Any, change: dict[str, Any], problem: str) -> None:
    coordinator, generator, _ = channels
    good = {"kind": "samples", "sentAt": "AAAAAAAA8D8=", "latencyMs": "AAAAAAAA8D8=", "errors": [], "last": True}
    generator.send({**good, **change})
    with pytest.raises(messages.MessageError) as raised:
        messages.receive_samples(coordinator)
    assert problem in str(raised.value)


def done_message(**change: Any) -> dict[str, Any]:
    """A generator's `done` message as it sends it, with `change` made to its fields."""
    stats = dataclasses.replace(summarise(2, samples(10)), generator=generator_verdict(9.0, [0.5], GeneratorLimits()))
    return {**LevelMessage.of(stats).model_dump(mode="json", by_alias=True, exclude_none=True), **change}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"generator": {"cpuPercent": "high", "sendGapMs": {"p99": 1.0}}},
            "generator.cpuPercent: 'high': Input should be a valid number",
        ),
        ({"generator": {"saturated": False}}, "generator: a generator's verdict without its cpuPercent and sendGapMs"),
        ({"requests": True}, "requests: True: Input should be a valid integer"),
        ({"errors": 2.0}, "errors: 2.0: Input should be a valid integer"),
        ({"throughputRps": "9.5"}, "throughputRps: '9.5': Input should be a valid number"),
        ({"openLoop": {"sentRps": 1.0, "lateSends": 1.5, "droppedSends": 0}}, "openLoop.lateSends: 1.5:"),
        ({"errorsByKind": {"http_503": "7"}}, "errorsByKind.http_503: '7': Input should be a valid integer"),
        ({"errorsByKind": {f"http_{i}": 1 for i in range(1001)}}, "errorsByKind: "),
        ({"errorsByKind": {"x" * 201: 1}}, "errorsByKind.xxxx"),
        ({"latencyCdfMs": [[0.0, 1.0]] * 202}, "latencyCdfMs: "),
        ({"latencyCdfMs": [[0.0, 1.0, 2.0]]}, "latencyCdfMs[0]: "),
        (
            {"phases": [{"name": "step 1", "seconds": 1, "requests": 1, "errors": 0, "throughputRps": 1}] * 2003},
            "phases: ",
        ),
        ({"latencyMs": {"p99": 10**400}}, "latencyMs.p99: "),
        ({"windowStart": None}, "windowStart: None: Input should be a valid number"),
        ({"stable": True}, "stable: unknown field"),
    ],
    ids=[
        "cpu-text",
        "no-cpu",
        "bool-count",
        "float-count",
        "text-number",
        "late-sends",
        "kind-count",
        "kinds",
        "long-kind",
        "long-cdf",
        "cdf-point",
        "phases",
        "huge-int",
        "null",
        "unknown",
    ],
)
def test_a_level_that_is_not_what_the_protocol_says_is_refused_naming_the_field(
    channels: Any, change: dict[str, Any], problem: str
) -> None:
    coordinator, generator, _ = channels
    generator.send(done_message(**change))
    with pytest.raises(messages.MessageError) as raised:  # a deadline: were it taken, no samples would follow
        messages.receive_done(coordinator, deadline=time.monotonic() + 10)
    assert str(raised.value).startswith("'done' message: ") and problem in str(raised.value), raised.value
