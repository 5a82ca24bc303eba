"""A tiny convolutional classifier for fast tests: same interface as the demo model, ~10 k parameters.

Input 32x32 RGB, 10 classes. Imported by `servinglab build-model tiny` and by the handler inside the
archive through `build_model()`.
"""

from __future__ import annotations

from torch import nn

INPUT_SIZE = 32
NUM_CLASSES = 10


def build_model() -> nn.Module:
    """Two conv blocks with BatchNorm (so precision handling is exercised), pooled, then linear."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, NUM_CLASSES),
    )
