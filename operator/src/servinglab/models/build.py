"""Build a built-in model: seeded weights with calibrated BatchNorm, its counts, its code; run as
`servinglab build-model NAME` (a child process of the local runner, or a server pod's init container).

This module imports torch (through :mod:`.counting`): nothing that generates load or reconciles imports
it; they start it as a program (:func:`servinglab.models.builtins.ensure_built`). Weights come from a
fixed seed, then BatchNorm running statistics are calibrated on seeded noise so activations stay
well-scaled (no inf/NaN in fp16). One pod builds while the others sharing the cache wait for the lock and
find the build current.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import tempfile
from pathlib import Path

from servinglab.models import counting, digests
from servinglab.models.builtins import (
    COUNTS_FILE,
    DIGESTS_FILE,
    MODEL_FILE,
    STAMP_FILE,
    WEIGHTS_FILE,
    build_folder,
    input_digest,
    is_current,
    lock_file,
)
from servinglab.models.catalogue import BuiltinModel, get_builtin, load_module


def build(name: str, build_root: Path | None = None, force: bool = False) -> tuple[Path, bool]:
    """Build a built-in model; return (the build, whether it was rebuilt)."""
    model = get_builtin(name)
    target = build_folder(name, build_root)
    if not force and is_current(name, build_root):
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    with lock_file(name, build_root).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_current(name, build_root):
            return target, False
        return _build_locked(model, target), True


def _build_locked(model: BuiltinModel, target: Path) -> Path:
    digest = input_digest(model)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as scratch:
        work = Path(scratch) / model.name
        work.mkdir()
        make_weights(model, work / WEIGHTS_FILE)
        shutil.copyfile(model.source, work / MODEL_FILE)
        (work / COUNTS_FILE).write_text(json.dumps(counting.builtin_counts(model.name)))
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    (target.parent / STAMP_FILE).write_text(digest + "\n")
    # last, once the build is whole; signed with the cache key when there is one (a shared cache)
    digests.write_manifest(target, target.parent / DIGESTS_FILE, digests.env_key(), inputs=digest)
    return target


def make_weights(model: BuiltinModel, destination: Path) -> None:
    import torch

    module = load_module(model.source)
    torch.manual_seed(model.seed)
    network = module.build_model()
    size = int(module.INPUT_SIZE)
    # Calibrate BatchNorm: a cumulative average (momentum=None) over seeded noise batches.
    for layer in network.modules():
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
            layer.momentum = None
            layer.reset_running_stats()
    generator = torch.Generator().manual_seed(model.seed)
    network.train()
    with torch.no_grad():
        for _ in range(model.calibration_batches):
            network(torch.randn(model.calibration_batch_size, 3, size, size, generator=generator))
    network.eval()
    torch.save(network.state_dict(), destination)
