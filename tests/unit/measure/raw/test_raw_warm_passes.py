"""The raw probe's timed passes start once the model runs as it will from now on: a TorchScript model's
profiling executor optimises its graph on its second and third calls (a traced ResNet-50 on an H200: 0.70 s,
1.04 s, then 4.5 ms a pass), and the old probe, which left only the first pass out, counted the 1.04 s pass as
the figure (61 rps at batch 64 against 14 000), so served/raw read 30.7 and the verdict near-raw-ceiling."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain, repeat
from types import SimpleNamespace
from typing import Any

import pytest

from servinglab.measure.raw import child
from servinglab_datapath import padded_size


class Clock:
    """Time that moves only when the fake model runs."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def probe_with_passes(monkeypatch: pytest.MonkeyPatch, durations: Iterator[float], padded: tuple[int, ...] = ()) -> Any:
    clock = Clock()
    monkeypatch.setattr(child.time, "monotonic", clock.monotonic)
    probe = object.__new__(child.Probe)

    def forward(_batch: Any) -> float:
        seconds = next(durations)
        clock.now += seconds
        return seconds

    probe.path = SimpleNamespace(padded_sizes=padded)
    probe.padded_size = padded_size
    probe.compiled_sizes, probe.compile_seconds = set(), 0.0
    probe.batch = lambda size: size  # type: ignore[method-assign]
    probe.forward = forward  # type: ignore[method-assign]
    return probe


def test_a_graph_optimised_on_its_second_and_third_calls_is_timed_after_them(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = probe_with_passes(monkeypatch, chain([0.70, 1.04], repeat(0.0045)))
    row = probe.measure(64, share=2.0)
    assert row.pass_seconds == pytest.approx(0.0045)
    assert row.throughput_rps == pytest.approx(64 / 0.0045, rel=0.01)
    assert row.note is None


def test_a_steady_model_is_timed_for_its_whole_share_after_its_uncounted_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes = chain([0.5], repeat(0.01))  # cuDNN's choice on the first pass, then steady
    probe = probe_with_passes(monkeypatch, passes)
    row = probe.measure(8, share=1.0)
    assert row.throughput_rps == pytest.approx(800, rel=0.01)
    # uncounted: 0.5, 0.01, 0.01 (two passes agree); then the whole share is timed
    assert row.passes == pytest.approx(1.0 / 0.01, abs=2)


def test_a_pass_longer_than_the_share_is_still_one_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = probe_with_passes(monkeypatch, repeat(3.0))  # a big model on a slow CPU
    row = probe.measure(4, share=2.0)
    assert row.passes == 1
    assert row.throughput_rps == pytest.approx(4 / 3.0, rel=1e-3)
    assert "longer than this size's" in row.note


@pytest.mark.parametrize(("passes", "steady"), [([1.0], False), ([1.0, 0.9], True), ([0.7, 1.04], False),
                                                ([1.04, 0.0045], False), ([0.0045, 0.0046], True)])  # fmt: skip
def test_two_passes_agree_within_the_factor(passes: list[float], steady: bool) -> None:
    assert child.steady(passes) is steady


def test_a_compiled_models_first_pass_at_a_new_padded_size_is_its_compile_not_a_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On an H200, ResNet-50 with CUDA graphs: the probe's one pass at batch 50 was the compile of size 64's graph
    (4.5 s), longer than the size's share, and the figure read 11 rps for a model that runs 23 000 alone."""
    passes = chain([4.5], repeat(0.003))  # size 64's graph compiled, then steady
    probe = probe_with_passes(monkeypatch, passes, padded=(1, 2, 4, 8, 16, 32, 64))
    row = probe.measure(50, share=2.0)
    assert row.compile_seconds == pytest.approx(4.5) and row.note is None
    assert row.throughput_rps == pytest.approx(50 / 0.003, rel=0.01)
    again = probe.measure(64, share=0.5)  # same padded size: compiled already, nothing uncounted beyond warm passes
    assert again.compile_seconds is None and again.throughput_rps == pytest.approx(64 / 0.003, rel=0.01)
    assert probe.compile_seconds == pytest.approx(4.5)
