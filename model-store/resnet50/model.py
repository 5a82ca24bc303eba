"""ResNet-50 (He et al., 2015) for 224x224 RGB images, written here so no weights are downloaded.

The architecture matches torchvision's `resnet50` (bottleneck blocks [3, 4, 6, 3], stride on the
3x3 convolution, 25.6 M parameters, about 4.1 GMACs per image). Weights come from a fixed seed and
BatchNorm statistics are calibrated on seeded noise (see servinglab.models), so outputs are
well-scaled in every precision. Imported by `servinglab build-model` and, inside the archive, by the
TorchServe handler through `build_model()`.
"""

from __future__ import annotations

import torch
from torch import nn

INPUT_SIZE = 224
NUM_CLASSES = 1000


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride), 1x1 expand, plus an identity or projected shortcut."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """Stem, four stages of bottlenecks, global average pool, linear classifier."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages = []
        in_channels = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            layers = []
            for index in range(blocks):
                layers.append(Bottleneck(in_channels, width, stride if index == 0 else 1))
                in_channels = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        for module in self.modules():
            # Zero-init the last BN of each block so every residual branch starts near identity.
            if isinstance(module, Bottleneck):
                nn.init.zeros_(module.bn3.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_model() -> nn.Module:
    """Fresh, randomly initialised model; the caller seeds torch and loads/saves the state dict."""
    return ResNet50()
