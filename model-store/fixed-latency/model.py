"""A model with a known service time, for checking capacity plans and calibrating the load generator.

Every forward pass (one batch, whatever its size) waits SERVICE_MS, then computes almost nothing: a linear
layer on the image's channel means. Waiting takes no CPU, so one worker serving batches of one answers at
most 1000 / SERVICE_MS requests a second on any host, and N such replicas answer N times that: a capacity
plan's replica count can be checked by running it (tests/k8s/real_node/test_plan_check_on_cluster.py), and a load
generator's own overhead read off against a server whose time is known. Input 32x32 RGB, 10 classes.

It runs eager only: a traced, exported or compiled form would drop or split the wait (servinglab refuses
`server.form` other than eager for it, :data:`servinglab.api.modelref.EAGER_ONLY_MODELS`).
"""

from __future__ import annotations

import time

import torch
from torch import nn

INPUT_SIZE = 32
NUM_CLASSES = 10
#: The time each forward pass takes, in milliseconds, whatever the batch.
SERVICE_MS = 100


class FixedLatency(nn.Module):
    """Waits SERVICE_MS, then a 3 -> NUM_CLASSES linear layer on the channel means."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3, NUM_CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        time.sleep(SERVICE_MS / 1000)
        return self.head(images.mean(dim=(2, 3)))


def build_model() -> nn.Module:
    return FixedLatency()
