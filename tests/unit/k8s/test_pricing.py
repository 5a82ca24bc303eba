"""Chart prices (issue 32, item 1): an experiment without spec.cost is priced from the operator chart's
`pricing` values by the node its server ran on (its GPU product per GPU, else the node by name); the spec's
own price wins; no price leaves the figures absent with a reason, never 0; bad values stop the operator at
start, naming the value. And a status's price reaches the results document `servinglab results` shows."""

from __future__ import annotations

import json
import re

import pytest

from servinglab.api import ExperimentSpec
from servinglab.api.cost import NO_PRICE, CostSpec, Price
from servinglab.api.figures import Latency
from servinglab.api.results import LevelResult, Runtime
from servinglab.k8s import pricing
from servinglab.k8s.settings import Settings
from servinglab.measure.document import experiment_results

CHART = pricing.Pricing.model_validate(
    {"currency": "EUR", "perGpuProduct": {"Tesla-T4": 0.35, "NVIDIA-A100-SXM4-40GB": 3.5}, "perNode": {"cpu-0": 0.12}}
)
T4 = {"nvidia.com/gpu.product": "Tesla-T4", "kubernetes.io/hostname": "gpu-t4-0"}


def test_the_specs_own_price_wins_over_the_charts() -> None:
    price = pricing.resolve(CostSpec(price_per_hour=2.0), CHART, "gpu-t4-0", T4, 1)
    assert price == Price(price_per_hour=2.0, currency="USD", source="spec")


def test_a_gpu_product_is_priced_per_gpu_the_replica_holds() -> None:
    assert pricing.resolve(None, CHART, "gpu-t4-0", T4, 1) == Price(
        price_per_hour=0.35, currency="EUR", source="gpu product Tesla-T4"
    )
    two = pricing.resolve(None, CHART, "gpu-t4-0", T4, 2)
    assert two is not None and two.price_per_hour == 0.7
    # the label key is a value too
    relabelled = CHART.model_copy(update={"gpu_product_label": "example.com/gpu"})
    assert pricing.resolve(None, relabelled, "gpu-t4-0", T4, 1) is None
    assert pricing.resolve(None, relabelled, "n", {"example.com/gpu": "Tesla-T4"}, 1) is not None
    # a MIG slice is not the whole GPU the product label names: no per-GPU price for it (the node's would do)
    assert pricing.resolve(None, CHART, "gpu-t4-0", T4, 1, "nvidia.com/mig-1g.5gb") is None
    assert pricing.resolve(None, CHART, "gpu-t4-0", T4, 1, "amd.com/gpu") is not None


def test_a_node_is_priced_by_name_and_a_replica_without_gpus_never_by_the_gpu() -> None:
    assert pricing.resolve(None, CHART, "cpu-0", {}, 0) == Price(
        price_per_hour=0.12, currency="EUR", source="node cpu-0"
    )
    # on a T4 node but holding no GPU: the GPU's price does not apply, and no price is not 0
    assert pricing.resolve(None, CHART, "gpu-t4-0", T4, 0) is None
    assert pricing.resolve(None, CHART, "gpu-t4-9", {"nvidia.com/gpu.product": "Tesla-V100"}, 1) is None
    assert pricing.resolve(None, pricing.Pricing(), "cpu-0", T4, 1) is None


def spec() -> ExperimentSpec:
    return ExperimentSpec.model_validate({"model": {"name": "tiny"}, "server": {"gpus": 1}})


LEVELS = [LevelResult(concurrency=1, throughput_rps=100.0, latency_ms=Latency(p99=10.0), requests=1000, errors=0)]


def test_the_resolved_price_reaches_each_levels_figures_and_none_leaves_them_absent_with_the_reason() -> None:
    runtime = Runtime(mode="cluster", server_pod="p")
    price = pricing.resolve(None, CHART, "gpu-t4-0", T4, 1)
    (priced,) = experiment_results("x", spec(), LEVELS, runtime=runtime, price=price).results
    assert priced.cost is not None
    assert (priced.cost.price_per_hour, priced.cost.currency, priced.cost.price_source) == (
        0.35,
        "EUR",
        "gpu product Tesla-T4",
    )
    assert priced.cost.cost_per_million == pytest.approx(0.35 / 360_000 * 1e6, rel=1e-5)
    (unpriced,) = experiment_results("x", spec(), LEVELS, runtime=runtime, price=None).results
    assert unpriced.cost is not None and unpriced.cost.cost_per_million is None and unpriced.cost.price_per_hour is None
    assert unpriced.cost.reason == NO_PRICE and "pricing.perGpuProduct" in NO_PRICE


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"perGpuProduct": {"Tesla-T4": -1}}, "pricing.perGpuProduct.Tesla-T4"),
        ({"perGpuProduct": {"Tesla-T4": 0}}, "pricing.perGpuProduct.Tesla-T4"),
        ({"perNode": {"cpu-0": "cheap"}}, "pricing.perNode.cpu-0"),
        ({"currency": "dollars"}, "pricing.currency"),
        ({"gpuProductLabel": "not a label"}, "pricing.gpuProductLabel"),
        ({"perGPUProduct": {}}, "pricing.perGPUProduct"),
    ],
)
def test_bad_chart_prices_stop_the_operator_at_start_naming_the_value(
    monkeypatch: pytest.MonkeyPatch, value: dict[str, object], named: str
) -> None:
    monkeypatch.setenv(pricing.ENV, json.dumps(value))
    with pytest.raises(ValueError, match=f"^{pricing.ENV} .*{re.escape(named)}") as refused:
        Settings.from_env()
    assert "got" in str(refused.value)
    monkeypatch.setenv(pricing.ENV, "{not json")
    with pytest.raises(ValueError, match=f"^{pricing.ENV} .*not JSON"):
        Settings.from_env()


def test_the_charts_prices_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pricing.ENV, json.dumps({"perGpuProduct": {"Tesla-T4": 0.35}}))
    assert Settings.from_env().pricing.per_gpu_product == {"Tesla-T4": 0.35}
    monkeypatch.delenv(pricing.ENV)
    assert Settings.from_env().pricing == pricing.Pricing()
