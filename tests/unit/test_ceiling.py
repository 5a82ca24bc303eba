"""The ceiling arithmetic: FLOPs counted from the model, the peak table, theoretical rate and ratios."""

from __future__ import annotations

import pytest

from servinglab.ceiling import PEAK_TFLOPS, accelerator_of, ceiling_report, count_flops, theoretical_rps


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


def test_report_gives_both_ratios_on_a_known_accelerator() -> None:
    report = ceiling_report(
        served_rps=900.0, flops_per_inference=8.18e9, raw_rps=1200.0, accelerator="T4", precision="fp16", batch_size=8
    )
    assert report["peakTflops"] == 65.0
    assert report["theoreticalRps"] == pytest.approx(7946.210, abs=1e-3)
    assert report["servedOverRaw"] == 0.75
    assert report["servedOverTheoretical"] == pytest.approx(900 / 7946.210, abs=1e-4)


def test_report_says_why_a_ratio_is_missing() -> None:
    on_cpu = ceiling_report(10.0, 8.18e9, 12.5, None, "fp32", 4)
    assert on_cpu["servedOverRaw"] == 0.8 and on_cpu["servedOverTheoretical"] is None
    assert "CPU" in on_cpu["note"]
    no_bf16 = ceiling_report(10.0, 8.18e9, 12.5, "T4", "bf16", 4)
    assert no_bf16["theoreticalRps"] is None and "no bf16 hardware path" in no_bf16["note"]


def test_the_accelerator_follows_the_servers_node_selector() -> None:
    from servinglab.ceiling import accelerator_from_spec
    from servinglab.spec import ServerSpec

    assert accelerator_from_spec(ServerSpec(gpus=1, node_selector={"nvidia.com/gpu.product": "Tesla-T4"})) == "T4"
    assert (
        accelerator_from_spec(ServerSpec(gpus=1, node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}))
        == "H100"
    )
    assert accelerator_from_spec(ServerSpec(gpus=1)) is None  # not pinned: unknown
    assert accelerator_from_spec(ServerSpec(gpus=0, node_selector={"nvidia.com/gpu.product": "Tesla-T4"})) is None


def test_the_served_figure_is_the_best_level_within_the_slo() -> None:
    from servinglab.ceiling import served_rps

    entries = [
        {"throughputRps": 100.0, "latencyMs": {"p99": 40.0}, "errors": 0},
        {"throughputRps": 180.0, "latencyMs": {"p99": 90.0}, "errors": 0},
        {"throughputRps": 250.0, "latencyMs": {"p99": 400.0}, "errors": 0},
    ]
    assert served_rps(entries, 100.0) == 180.0
    assert served_rps(entries, None) == 250.0
    assert served_rps(entries, 10.0) is None


def test_without_a_raw_figure_the_report_says_where_it_is_measured() -> None:
    report = ceiling_report(150.0, 3_244_672, None, "T4", "fp32", 4)
    assert report["servedOverRaw"] is None and report["theoreticalRps"] == pytest.approx(8.1e12 / 3_244_672, abs=1e-3)
    assert "raw throughput is measured by local runs" in report["note"]
