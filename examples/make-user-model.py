"""Writes a user-style model for the examples: a small image classifier (four convolutions, 10 classes, 64x64
RGB in) saved as TorchScript, as a training pipeline's `torch.jit.save` would leave it, and prints its sha256.

    .venv/bin/python examples/make-user-model.py            # writes ./user-classifier.pt
    .venv/bin/python examples/make-user-model.py out/my.pt  # or where you say

examples/sweep-user-model-forms.yaml serves it from ./user-classifier.pt (run the sweep from the folder the
file is in). The weights are seeded, but a TorchScript file's bytes may differ between torch versions, so the
example records the digest rather than checking it: put the printed sha256 in `source.sha256` to check yours.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch


class UserClassifier(torch.nn.Module):
    """Conv-BN-ReLU blocks halving the image, global pooling and a linear head: the shape of many small CNNs."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        blocks: list[torch.nn.Module] = []
        for inputs, outputs in ((3, 32), (32, 64), (64, 128), (128, 128)):
            blocks += [torch.nn.Conv2d(inputs, outputs, 3, stride=2, padding=1, bias=False),
                       torch.nn.BatchNorm2d(outputs), torch.nn.ReLU()]  # fmt: skip
        self.features = torch.nn.Sequential(*blocks, torch.nn.AdaptiveAvgPool2d(1))
        self.head = torch.nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def main(path: Path) -> None:
    torch.manual_seed(0)
    model = UserClassifier().eval()
    torch.jit.save(torch.jit.script(model), str(path))  # type: ignore[no-untyped-call]
    print(f"{path}: sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "user-classifier.pt"))
