"""The ceiling arithmetic: FLOPs counted from the model, the peak table, theoretical rate and ratios."""

from __future__ import annotations

import pytest

from servinglab.api.ceiling import RawRow, RawSkip
from servinglab.api.figures import ServerBreakdown
from servinglab.api.results import LevelResult
from servinglab.measure.ceiling import (
    PEAK_TFLOPS,
    accelerator_of,
    ceiling_report,
    formed_batch_size,
    raw_block,
    scan_batch_sizes,
    theoretical_rps,
)
from servinglab.measure.raw.figures import RawFigures
from servinglab.models.counting import count_flops


def test_flops_are_counted_from_the_model_itself() -> None:
    # tiny: conv 3->16 3x3 on 32x32, conv 16->32 3x3 on 16x16, linear 32->10; a multiply-add is 2 FLOPs
    by_hand = 2 * (16 * 32 * 32 * 3 * 9 + 32 * 16 * 16 * 16 * 9 + 32 * 10)
    assert count_flops("tiny") == by_hand == 3_244_672


def test_resnet50_flops_match_its_published_4_1_gmacs() -> None:
    assert count_flops("resnet50") == pytest.approx(2 * 4.09e9, rel=0.01)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_device_names_map_to_the_peak_table(name: str, key: str | None) -> None:
    assert accelerator_of(name) == key


def test_peak_table_is_complete_and_ordered() -> None:
    assert set(PEAK_TFLOPS) == {"T4", "L4", "A10G", "A100", "H100", "H200"}
    for accelerator, peaks in PEAK_TFLOPS.items():
        assert set(peaks) == {"fp32", "tf32", "fp16", "bf16"}, accelerator
        fp32 = peaks["fp32"]
        assert fp32 is not None
        for precision in ("tf32", "fp16", "bf16"):
            peak = peaks[precision]
            assert peak is None or peak >= fp32, (accelerator, precision)  # tensor paths are faster


def test_theoretical_rate_is_peak_over_flops() -> None:
    # ResNet-50 (8.18 GFLOPs) on a T4 at fp16 (65 TFLOPS): about 7 946 inferences per second
    assert theoretical_rps(8.18e9, 65.0) == pytest.approx(65e12 / 8.18e9)
    assert theoretical_rps(8.18e9, None) is None


def figures(**rows: float) -> RawFigures:
    """Raw figures measured at the given batch sizes (`b8=1200.0` is 1200 rps at batch 8)."""
    measured = {int(k[1:]): RawRow(batch_size=int(k[1:]), throughput_rps=v) for k, v in rows.items()}
    return RawFigures(device="cpu", measured=measured, skipped={1024: "one pass would take about 60 s"})


def test_report_gives_every_ratio_on_a_known_accelerator() -> None:
    raw = raw_block(7.6, 8, figures(b8=1200.0, b1=300.0, b64=1800.0), budget=5.0)
    report = ceiling_report(served_rps=900.0, flops_per_inference=8.18e9, raw=raw, accelerator="T4", precision="fp16")
    assert report.peak_tflops == 65.0
    assert report.theoretical_rps == pytest.approx(7946.210, abs=1e-3)
    # served/raw compares the batch size the server formed (mean 7.6 -> 8), not the best one
    assert (report.raw_batch_size, report.formed_batch_size_mean, report.raw_at_formed_batch_rps) == (8, 7.6, 1200.0)
    assert report.served_over_raw == 0.75
    assert (report.raw_best_batch_size, report.raw_best_rps, report.served_over_best_raw) == (64, 1800.0, 0.5)
    assert report.served_over_theoretical == pytest.approx(900 / 7946.210, abs=1e-4)
    assert report.raw_skipped == [RawSkip(batch_size=1024, reason="one pass would take about 60 s")]
    assert [row.batch_size for row in report.raw_table or []] == [1, 8, 64]


def test_report_says_why_a_ratio_is_missing() -> None:
    on_cpu = ceiling_report(10.0, 8.18e9, raw_block(4.0, 4, figures(b4=12.5), 5.0), None, "fp32")
    assert on_cpu.served_over_raw == 0.8 and on_cpu.served_over_theoretical is None
    assert "CPU" in (on_cpu.note or "")
    no_bf16 = ceiling_report(10.0, 8.18e9, raw_block(4.0, 4, figures(b4=12.5), 5.0), "T4", "bf16")
    assert no_bf16.theoretical_rps is None and "no bf16 hardware path" in (no_bf16.note or "")
    # the formed size could not be measured (memory or budget): no served/raw, and the note says why
    unmeasured = ceiling_report(10.0, 8.18e9, raw_block(64.0, 64, figures(b1=5.0), 5.0), None, "fp32")
    assert unmeasured.served_over_raw is None and unmeasured.served_over_best_raw == 2.0
    assert "could not be measured at the formed batch size 64" in (unmeasured.note or "")


def served(mean_batch: float | None) -> LevelResult:
    return LevelResult(throughput_rps=1.0, requests=1, errors=0, server=ServerBreakdown(mean_batch_size=mean_batch))


def test_the_raw_figure_follows_the_batch_size_the_server_formed() -> None:
    assert formed_batch_size(served(6.6), 1024) == (7, 6.6)
    assert formed_batch_size(served(0.4), 1024) == (1, 0.4)
    assert formed_batch_size(served(9.0), 8) == (8, 9.0)  # never above the maximum
    assert formed_batch_size(served(None), 16) == (16, None)  # no counters: the configured size
    assert formed_batch_size(None, 16) == (16, None)


def test_the_scan_covers_powers_of_two_up_to_the_maximum_formed_size_first() -> None:
    assert scan_batch_sizes(8, 1024) == [8, 1, 2, 4, 16, 32, 64, 128, 256, 512, 1024]
    assert scan_batch_sizes(7, 12) == [7, 1, 2, 4, 8, 12]
    assert scan_batch_sizes(1, 1) == [1]


def test_the_accelerator_follows_the_servers_node_selector() -> None:
    from servinglab.api import ServerSpec
    from servinglab.measure.ceiling import accelerator_from_spec

    assert accelerator_from_spec(ServerSpec(gpus=1, node_selector={"nvidia.com/gpu.product": "Tesla-T4"})) == "T4"
    assert (
        accelerator_from_spec(ServerSpec(gpus=1, node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}))
        == "H100"
    )
    assert accelerator_from_spec(ServerSpec(gpus=1)) is None  # not pinned: unknown
    assert accelerator_from_spec(ServerSpec(gpus=0, node_selector={"nvidia.com/gpu.product": "Tesla-T4"})) is None


def test_the_served_figure_is_the_best_level_within_the_slo() -> None:
    from servinglab.measure.levels import served_level

    entries = [
        LevelResult.model_validate({"throughputRps": 100.0, "latencyMs": {"p99": 40.0}, "errors": 0, "requests": 9}),
        LevelResult.model_validate({"throughputRps": 180.0, "latencyMs": {"p99": 90.0}, "errors": 0, "requests": 9}),
        LevelResult.model_validate({"throughputRps": 250.0, "latencyMs": {"p99": 400.0}, "errors": 0, "requests": 9}),
    ]
    assert served_level(entries, 100.0) == entries[1]
    assert served_level(entries, None) == entries[2]
    assert served_level(entries, 10.0) is None


def test_without_a_raw_figure_the_report_says_where_it_is_measured() -> None:
    report = ceiling_report(150.0, 3_244_672, raw_block(3.2, 3, None, 5.0), "T4", "fp32")
    assert report.served_over_raw is None and report.theoretical_rps == pytest.approx(8.1e12 / 3_244_672, abs=1e-3)
    assert report.raw_batch_size == 3 and "raw throughput is measured by local runs" in (report.note or "")
