"""servinglab's TorchServe image handler without TorchServe: the parts of its context the handler uses, faked,
around a real model archive's folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servinglab_image_handler import ServinglabImageHandler


class FakeMetrics:
    """Records add_metric calls as TorchServe's metric cache would receive them."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def add_metric(self, name: str, value: float, unit: str, metric_type: Any = None, **_: Any) -> None:
        self.values.setdefault(name, []).append(value)


class FakeContext:
    """The parts of ts.context.Context the handler uses."""

    def __init__(self, model_dir: Path, precision: str, batch_size: int = 4) -> None:
        manifest = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())
        self.manifest = manifest
        self.system_properties = {"model_dir": str(model_dir), "gpu_id": None, "batch_size": batch_size}
        self.model_yaml_config = {"handler": {"precision": precision, "topK": 3}}
        self.metrics = FakeMetrics()
        self.statuses: dict[int, tuple[int, str]] = {}

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.statuses[idx] = (code, phrase)


def handler_for(model_dir: Path, precision: str) -> tuple[ServinglabImageHandler, FakeContext]:
    context = FakeContext(model_dir, precision)
    handler = ServinglabImageHandler()
    handler.initialize(context)
    return handler, context


def rows(*bodies: bytes) -> list[dict[str, Any]]:
    return [{"body": body} for body in bodies]
