"""What serving costs: the price of a server replica per hour (`spec.cost`), and the figures a level's
measured throughput gives with it (pure).

A level's cost per million inferences is the replica's price over the inferences it answers in an hour;
its GPU-seconds per thousand inferences need no price; its energy per inference comes from the GPU's
telemetry. A figure that cannot be computed is absent, with a `reason`, never 0: a free server is not
what an unpriced run measured.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import Field

from servinglab.api.meta import ResultModel, SpecModel

#: The most an hour of one replica may cost (a bound against a typo of a few orders of magnitude).
MAX_PRICE_PER_HOUR = 10_000.0

NO_PRICE = (
    "no price: set spec.cost.pricePerHour, --price-per-hour locally, or in the cluster the chart's "
    "pricing.perGpuProduct or pricing.perNode for the server's node"
)
NO_THROUGHPUT = "no throughput: nothing was answered, so there is no cost per inference"


class CostSpec(SpecModel):
    """The price of what one server replica holds (its GPUs, CPUs and memory), per hour."""

    price_per_hour: float = Field(
        gt=0, le=MAX_PRICE_PER_HOUR, description="What one replica of the server costs per hour, in `currency`."
    )
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$", description="An ISO 4217 code (USD, EUR, ...).")


class Price(ResultModel):
    """The price a run's figures are at, and where it came from: `spec` (spec.cost, or --price-per-hour),
    `gpu product <label value>` or `node <name>` (the operator chart's pricing values, for the node the
    server pod ran on)."""

    price_per_hour: float
    currency: str
    source: str


def spec_price(cost: CostSpec | None) -> Price | None:
    """The spec's own price (with --price-per-hour, the command line's), as a price with its source."""
    return Price(price_per_hour=cost.price_per_hour, currency=cost.currency, source="spec") if cost else None


class CostFigures(ResultModel):
    """One level's cost at its measured throughput: per million inferences (needs a price), GPU-seconds per
    thousand inferences (with a GPU), and energy per inference (from GPU telemetry). `reason` says why a
    figure is absent."""

    #: The throughput the figures are at (the level's measured throughput, or a confirmation's mean).
    throughput_rps: float | None = None
    price_per_hour: float | None = None
    currency: str | None = None
    #: Where the price came from (see :class:`Price`).
    price_source: str | None = None
    #: How many replicas answered the throughput, each at `price_per_hour` (absent: one).
    replicas: int | None = None
    cost_per_million: float | None = None
    gpu_seconds_per_thousand: float | None = None
    energy_per_inference_joules: float | None = None
    reason: str | None = None


def cost_figures(
    price: CostSpec | Price | None,
    throughput_rps: float,
    gpus: int,
    energy_per_inference_joules: float | None = None,
    replicas: int = 1,
) -> CostFigures:
    """The cost figures of one level answered at `throughput_rps` by `replicas` replicas each holding `gpus`
    GPUs: the whole deployment is priced (the price per replica-hour x `replicas`)."""
    several = replicas if replicas > 1 else None
    if isinstance(price, CostSpec):
        price = spec_price(price)
    if throughput_rps <= 0:
        return CostFigures(
            price_per_hour=price.price_per_hour if price else None, currency=price.currency if price else None,
            price_source=price.source if price else None,
            energy_per_inference_joules=energy_per_inference_joules, reason=NO_THROUGHPUT,
        )  # fmt: skip
    return CostFigures(
        throughput_rps=throughput_rps,
        price_per_hour=price.price_per_hour if price else None,
        currency=price.currency if price else None,
        price_source=price.source if price else None,
        replicas=several,
        cost_per_million=_figure(price.price_per_hour * replicas / (throughput_rps * 3600) * 1e6) if price else None,
        gpu_seconds_per_thousand=_figure(gpus * replicas * 1000 / throughput_rps) if gpus >= 1 else None,
        energy_per_inference_joules=energy_per_inference_joules,
        reason=None if price else NO_PRICE,
    )


def at_throughput(figures: CostFigures, throughput_rps: float) -> CostFigures:
    """The same replica's figures at another throughput (a confirmation's mean capacity, say)."""
    if not figures.throughput_rps or throughput_rps <= 0:
        return figures
    ratio = figures.throughput_rps / throughput_rps
    return figures.model_copy(update={
        "throughput_rps": throughput_rps,
        "cost_per_million": _figure(figures.cost_per_million * ratio) if figures.cost_per_million else None,
        "gpu_seconds_per_thousand":
            _figure(figures.gpu_seconds_per_thousand * ratio) if figures.gpu_seconds_per_thousand else None,
    })  # fmt: skip


def _figure(value: float) -> float:
    """Six significant digits: a tiny cost stays a cost (rounding to decimals could make it 0)."""
    return float(f"{value:.6g}")


def with_price(document: Any, price_per_hour: float | None) -> Any:
    """An experiment or sweep document (as read, before validation) with the command line's price per hour,
    which overrides its `cost` (a sweep's template's); validated as the spec's own would be. None: as is."""
    if price_per_hour is None or not isinstance(document, dict):
        return document
    changed = copy.deepcopy(document)
    spec = changed.setdefault("spec", {})
    if isinstance(spec, dict) and changed.get("kind") == "ServingSweep":
        spec = spec.setdefault("template", {})
    if not isinstance(spec, dict):
        return document  # validation names what is wrong with the document
    cost = spec.get("cost")
    spec["cost"] = {**(cost if isinstance(cost, dict) else {}), "pricePerHour": price_per_hour}
    return changed
