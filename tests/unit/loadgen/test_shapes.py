"""Traffic shapes: the schedules they send, trace files (a bad line is refused by number; a trace
outside the payload folder or past its bounds is refused), how generators split a schedule, and the
per-phase figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from servinglab.api import ShapeSpec, SpecError, TraceShape, parse_experiment
from servinglab.loadgen import shapes
from servinglab.loadgen.stats import Sample, rounded, summarise
from support import manifests


def shape(**fields: object) -> ShapeSpec:
    return ShapeSpec.model_validate(fields)


def test_a_step_holds_each_rate_for_its_step() -> None:
    schedule = shapes.build(shape(step={"rates": [10, 40], "stepSeconds": 5}), 2.0, "constant", 0)
    assert [p.name for p in schedule.phases] == ["step 1: 10 rps", "step 2: 40 rps"]
    assert schedule.measured_seconds == 10.0 and schedule.warmup_seconds == 2.0
    warmup = [o for o in schedule.offsets if o < 2.0]
    first = [o for o in schedule.offsets if 2.0 <= o < 7.0]
    second = [o for o in schedule.offsets if o >= 7.0]
    assert (len(warmup), len(first), len(second)) == (20, 50, 200)
    assert list(schedule.offsets) == sorted(schedule.offsets)


def test_bursts_come_at_the_end_of_every_period() -> None:
    burst = {"baseRps": 10, "burstRps": 100, "burstSeconds": 1, "periodSeconds": 4, "durationSeconds": 10}
    schedule = shapes.build(shape(burst=burst), 0.0, "constant", 0)
    layout = [(p.name, p.start, p.end, p.rate_rps) for p in schedule.phases]
    assert layout == [("base 1", 0, 3, 10), ("burst 1", 3, 4, 100), ("base 2", 4, 7, 10), ("burst 2", 7, 8, 100),
                      ("base 3", 8, 10, 10)]  # fmt: skip
    assert len(schedule.offsets) == 3 * 10 + 100 + 3 * 10 + 100 + 2 * 10


def test_a_trace_is_replayed_at_its_speed_with_its_payloads(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("# recorded\n100.0,2\n100.5,0\n\n101.0 1  # a comment\n103.0,2\n")
    trace = shape(trace={"file": "t.csv", "speed": 2})
    schedule = shapes.build(trace, 0.0, "poisson", 0, tmp_path, payload_count=3)
    assert schedule.offsets == (0.0, 0.25, 0.5, 1.5) and schedule.payload_indices == (2, 0, 1, 2)
    assert schedule.measured_seconds == pytest.approx(1.5)
    # every sender's share: every N-th send, so together they are the schedule
    parts = [schedule.share(number, 3) for number in range(3)]
    assert sorted(o for part in parts for o in part.offsets) == list(schedule.offsets)
    assert parts[1].offsets == (0.25,) and parts[1].payload_indices == (0,)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("0\n1\nsoon\n", "line 3: 'soon' is not a time in seconds"),
        ("0\n2\n1\n", "line 3: 1 s is before the previous line's 2 s"),
        ("0,1\n1\n", "line 2: payload indices must be given on every line or on none"),
        ("0,1\n1,-2\n", "line 2: payload index '-2' is not a whole number >= 0"),
        ("0,1\n1,9\n", "line 2: payload index 9 is past the 3 payloads"),
        ("0,1,2\n", "line 1: '0,1,2' has 3 fields"),
        ("# nothing\n", "no requests in it"),
        ("0\ninf\n", "line 2: 'inf' is not a finite time"),
    ],
)
def test_a_bad_trace_line_is_refused_by_number(tmp_path: Path, text: str, problem: str) -> None:
    (tmp_path / "bad.txt").write_text(text)
    with pytest.raises(shapes.TraceError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        shapes.read_trace(tmp_path / "bad.txt", payload_count=3)


def test_a_missing_trace_is_named(tmp_path: Path) -> None:
    with pytest.raises(shapes.TraceError, match=r"nowhere\.csv"):
        shapes.read_trace(tmp_path / "nowhere.csv")


def test_each_phase_gets_its_own_exact_figures() -> None:
    schedule = shapes.build(shape(step={"rates": [10, 20], "stepSeconds": 2}), 0.0, "constant", 0)
    start = 1000.0
    samples = [Sample(start + o, 5.0 if o < 2 else 50.0 + o) for o in schedule.offsets]
    first, second = shapes.phase_figures(samples, start, schedule)
    assert first.requests == 20 and second.requests == 40
    assert first.latency_ms == rounded(summarise(None, samples[:20]).latency_ms)
    assert second.latency_ms.p99 == round(summarise(None, samples[20:]).latency_ms.p99 or 0.0, 3)


def experiment(load: dict[str, object]) -> dict[str, object]:
    return manifests.experiment("x", load=load)


@pytest.mark.parametrize(
    ("load", "problem"),
    [
        ({"mode": "closed", "shape": {"step": {"rates": [1, 2], "stepSeconds": 1}}}, "need mode: open"),
        ({"mode": "open", "shape": {"step": {"users": [1, 2], "stepSeconds": 1}}}, "step.users needs mode: closed"),
        ({"mode": "closed", "shape": {"step": {"users": [1], "stepSeconds": 1}}}, "at least 2 items"),
        ({"mode": "closed", "shape": {"step": {"users": [1, 2], "rates": [1, 2], "stepSeconds": 1}}}, "not both"),
        ({"mode": "open", "rates": [5], "shape": {"step": {"rates": [1, 2], "stepSeconds": 1}}}, "shape replaces"),
        ({"mode": "open", "shape": {}}, "exactly one of step, burst or trace"),
        (
            {
                "mode": "open",
                "shape": {
                    "burst": {"baseRps": 5, "burstRps": 50, "burstSeconds": 4, "periodSeconds": 4, "durationSeconds": 8}
                },
            },
            "burstSeconds 4 must be shorter",
        ),
        ({"mode": "open", "repeats": 2, "shape": {"trace": {"file": "t"}}}, "a shaped run is one run"),
    ],
)
def test_shape_specs_that_cannot_run_are_refused(load: dict[str, object], problem: str) -> None:
    with pytest.raises(SpecError, match=problem):
        parse_experiment(experiment(load))


def test_a_step_of_users_splits_each_step_between_generators() -> None:
    schedule = shapes.build(shape(step={"users": [1, 4, 7], "stepSeconds": 5}), 2.0, "poisson", 0)
    assert schedule.offsets == () and [p.users for p in schedule.phases] == [1, 4, 7]
    assert [p.name for p in schedule.phases] == ["step 1: 1 users", "step 2: 4 users", "step 3: 7 users"]
    parts = [schedule.share(number, 2) for number in range(2)]
    assert [[p.users for p in part.phases] for part in parts] == [[1, 2, 4], [0, 2, 3]]
    samples = [Sample(1000.0 + t, 10.0) for t in (1.0, 6.0, 7.0, 12.0)]
    figures = shapes.phase_figures(samples, 1000.0, schedule)
    assert [(f.users, f.requests) for f in figures] == [(1, 1), (4, 2), (7, 1)] and figures[0].rate_rps is None


def trace(file: str, speed: float = 1.0) -> TraceShape:
    return TraceShape.model_validate({"file": file, "speed": speed})


def test_a_trace_outside_the_payload_folder_is_refused_and_not_echoed(tmp_path: Path) -> None:
    """The payload folder holds a symlink to a file outside it: the file's first line never reaches the error."""
    (tmp_path / "outside.txt").write_text("eyJ-a-token-not-a-time\n")
    (tmp_path / "payload").mkdir()
    (tmp_path / "payload" / "t.csv").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(shapes.TraceError) as refused:
        shapes.load_trace(trace("t.csv"), tmp_path / "payload")
    assert str(refused.value) == (
        f"load.shape.trace.file: 't.csv' leads outside the payload folder {tmp_path / 'payload'}; name a file inside it"
    )
    with pytest.raises(shapes.TraceError, match="leads outside"):  # as the load reads it, also past the spec
        shapes.build(shape(trace={"file": "t.csv"}), 0.0, "constant", 0, tmp_path / "payload")


@pytest.mark.parametrize(
    ("text", "speed", "window", "problem"),
    [
        ("#\n" * 2_000_001, 1.0, None, "trace t.csv line 2000001: more than 2000000 lines; at most that many"),
        ("0\n" * 1_000_001, 1.0, None, "trace t.csv line 1000001: more than 1000000 sends; at most that many"),
        ("0\n7201\n", 1.0, None, "trace t.csv: lasts 7201 s replayed at speed 1; at most 7200 s"),
        ("0\n20000\n", 2.0, None, "trace t.csv: lasts 10000 s replayed at speed 2; at most 7200 s"),
        ("0\n7000\n", 1.0, 0.5, "trace t.csv: 7000 s replayed are 14000 stability windows of 0.5 s; at most 10000 "
                                "(load.stability.windowSeconds >= 0.7)"),
    ],
    ids=["lines", "sends", "seconds", "seconds-at-speed", "windows"],
)  # fmt: skip
def test_a_trace_past_its_bounds_is_refused_naming_the_bound(
    tmp_path: Path, text: str, speed: float, window: float | None, problem: str
) -> None:
    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(shapes.TraceError) as refused:
        shapes.load_trace(trace("t.csv", speed), tmp_path, window_seconds=window)
    assert problem in str(refused.value)


def test_a_trace_file_past_its_size_is_refused_unread(tmp_path: Path) -> None:
    with (tmp_path / "t.csv").open("wb") as big:  # sparse
        big.truncate(shapes.MAX_TRACE_BYTES + 1)
    with pytest.raises(shapes.TraceError, match=r"trace t\.csv is larger than 64 MiB; at most that is read"):
        shapes.load_trace(trace("t.csv"), tmp_path)


def test_a_long_trace_inside_every_bound_is_read(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("".join(f"{i * 0.0072:.4f}\n" for i in range(1_000_000)))  # 7200 s, 1M sends
    times, indices = shapes.load_trace(trace("t.csv"), tmp_path, window_seconds=0.72)
    assert len(times) == 1_000_000 and times[-1] == pytest.approx(7199.9928) and indices is None
