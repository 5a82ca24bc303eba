"""The chart's prices (its `pricing` values): what a server replica costs per hour on the node its pod ran
on, for an experiment whose spec gives no `cost` (pure).

Read once at start by :mod:`servinglab.k8s.settings` (SERVINGLAB_PRICING, JSON; a bad value stops the
operator naming it); used when the load Job's results are written to status. The spec's own price wins;
then the node's GPU product (its `gpuProductLabel`, nvidia.com/gpu.product as NVIDIA's GPU feature
discovery sets it) priced per GPU, times the GPUs the replica holds; then the node's own price by name.
No price: None, and the figures that need one are absent with :data:`~servinglab.api.cost.NO_PRICE`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated

from pydantic import Field, ValidationError, field_validator

from servinglab.api.cost import MAX_PRICE_PER_HOUR, CostSpec, Price, spec_price
from servinglab.api.kube import label_key_problem
from servinglab.api.meta import SpecModel

#: The environment variable the chart sets from its `pricing` values.
ENV = "SERVINGLAB_PRICING"
#: The node label NVIDIA's GPU feature discovery puts the GPU's product name in (Tesla-T4, NVIDIA-A100-SXM4-40GB).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

PricePerHour = Annotated[float, Field(gt=0, le=MAX_PRICE_PER_HOUR)]


class Pricing(SpecModel):
    """The chart's `pricing` values."""

    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    gpu_product_label: str = GPU_PRODUCT_LABEL
    per_gpu_product: dict[str, PricePerHour] = Field(default_factory=dict)
    per_node: dict[str, PricePerHour] = Field(default_factory=dict)

    def priced(self) -> bool:
        """Whether any node can be priced (a GPU product or a node has a price)."""
        return bool(self.per_gpu_product or self.per_node)

    @field_validator("gpu_product_label")
    @classmethod
    def _label_key(cls, value: str) -> str:
        if (problem := label_key_problem(value)) is not None:
            raise ValueError(problem)
        return value


def parse(text: str) -> Pricing:
    """SERVINGLAB_PRICING: the chart's prices; empty: none. A bad value raises ValueError naming it."""
    if not text.strip():
        return Pricing()
    try:
        return Pricing.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{ENV} (the chart's pricing values): not JSON: {exc}") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "pricing"
        raise ValueError(
            f"{ENV} (the chart's pricing values): pricing.{where}: {error['msg']} (got {error.get('input')!r})"
        ) from None


def resolve(
    cost: CostSpec | None,
    pricing: Pricing,
    node: str | None,
    labels: Mapping[str, str],
    gpus: int,
    gpu_resource: str = "nvidia.com/gpu",
) -> Price | None:
    """The price of one replica holding `gpus` GPUs (of `gpu_resource`) on node `node` (with its `labels`):
    the spec's, else the chart's per GPU of the node's product, else the chart's for the node; None if none
    applies. A slice of a GPU (a MIG profile: the product label names the whole GPU) is not priced as one."""
    if cost is not None:
        return spec_price(cost)
    product = labels.get(pricing.gpu_product_label)
    whole = gpu_resource.rsplit("/", 1)[-1] == "gpu"
    if gpus >= 1 and whole and product is not None and product in pricing.per_gpu_product:
        per_gpu = pricing.per_gpu_product[product]
        return Price(price_per_hour=float(f"{per_gpu * gpus:.6g}"), currency=pricing.currency,
                     source=f"gpu product {product}")  # fmt: skip
    if node is not None and node in pricing.per_node:
        return Price(price_per_hour=pricing.per_node[node], currency=pricing.currency, source=f"node {node}")
    return None
