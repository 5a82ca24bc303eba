"""Variants of the tiny model whose bottleneck is known, for the verdict tests: servinglab's own handler
with one stage made slow on purpose, served from a no-archive folder like a user's (format directory).

- `preprocess_sleep_ms`: each request's decode sleeps that long (a worker stuck in its CPU decode);
- `inference_sleep_ms`: each batch's forward pass sleeps that long, and with `skipModel` does nothing else
  (a worker waiting on a device that has room: more workers would overlap the waits);
- `inference_burn`: each sample's forward pass also multiplies `burn x burn` matrices `rounds` times (a
  model whose compute on this CPU dominates).

The variant subclasses servinglab's handler (so its counters, which the breakdown reads, are the same)
and wraps the decode function and the model; `variant.json` beside it says how.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

VARIANT_HANDLER = '''
"""The tiny model with one stage made slow on purpose (servinglab's verdict tests)."""
import json
import time
from pathlib import Path

import torch

import servinglab_datapath as datapath
import servinglab_image_handler as base

SETTINGS = json.loads((Path(__file__).parent / "variant.json").read_text())
_decode = datapath.decode_image


def _slow_decode(body, size):
    time.sleep(SETTINGS.get("preprocessSleepMs", 0) / 1000)
    return _decode(body, size)


if SETTINGS.get("preprocessSleepMs"):
    datapath.decode_image = _slow_decode  # the name the batch maker decodes each body with


def _slowed(model):
    """The model, its forward pass made slower (a function, not a class: one class per handler file)."""
    inner = model.forward
    burn, rounds = int(SETTINGS.get("inferenceBurn", 0)), int(SETTINGS.get("burnRounds", 1))
    state = {"matrix": torch.full((burn, burn), 1.0 / max(burn, 1))}

    def forward(x):
        if SETTINGS.get("inferenceSleepMs"):
            time.sleep(SETTINGS["inferenceSleepMs"] / 1000)
        for _ in range(x.shape[0] * rounds if burn else 0):
            state["matrix"] = torch.mm(state["matrix"], state["matrix"])
        if SETTINGS.get("skipModel"):
            return torch.zeros((x.shape[0], 10), dtype=x.dtype)
        return inner(x)

    model.forward = forward
    return model


class VariantHandler(base.ServinglabImageHandler):
    def initialize(self, context):
        super().initialize(context)
        self.model = _slowed(self.model)
'''


def tiny_variant(tiny_archive: Path, into: Path, name: str, **settings: Any) -> Path:
    """A copy of the tiny model's folder, named `name`, served by the variant handler with `settings`
    (camelCase keys: preprocessSleepMs, inferenceSleepMs, skipModel, inferenceBurn, burnRounds)."""
    shutil.copytree(tiny_archive, into)
    (into / "variant_handler.py").write_text(textwrap.dedent(VARIANT_HANDLER))
    (into / "variant.json").write_text(json.dumps(settings))
    manifest_path = into / "MAR-INF" / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["model"]["handler"] = "variant_handler.py"
    manifest["model"]["modelName"] = name  # the experiment's model name: TorchServe registers it by this
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return into
