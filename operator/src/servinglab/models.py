"""The built-in demo models and how their TorchServe archives are built (`servinglab build-model`).

Each built-in model is a `model-store/<name>/model.py` exposing `build_model()`, `INPUT_SIZE` and
`NUM_CLASSES`. Weights come from a fixed seed, then BatchNorm running statistics are calibrated on
seeded noise so activations stay well-scaled (no inf/NaN in fp16). The archive is TorchServe's
`no-archive` directory format: a plain folder the runner can copy and give a per-experiment
model-config.yaml. A build is skipped when the sha256 over all of its inputs is unchanged and the build
still is what was built: a manifest of every file's digest is written last (:mod:`servinglab.digests`) and
re-checked before reuse, as the build may sit on the model cache that server pods share. A build that
differs is rebuilt; a copy into a model store that differs (`install`) is refused.

Called by the CLI (`build-model`) and by the local runner, which runs it in a child process so that
torch is never imported into the load-generating process.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from servinglab import digests, paths
from servinglab.api import ModelInput, ModelRef, PayloadSpec
from servinglab.servers.torchserve.config import ARCHIVE_VERSION

HANDLER_FILE = "servinglab_image_handler.py"
HANDLER_HELPERS = ("servinglab_imaging.py",)
STAMP_FILE = "inputs.sha256"
#: Beside the stamp: every file of the archive with its sha256, written last.
DIGESTS_FILE = "digests.json"
WEIGHTS_FILE = "weights.pt"
#: Parameters and FLOPs per inference, counted when the archive is built (same name as a user model's).
COUNTS_FILE = "servinglab-counts.json"
CONFIG_FILE = "model-config.yaml"
#: Bumped whenever the way archives are produced changes, so old builds are rebuilt.
RECIPE_VERSION = "1"


@dataclass(frozen=True)
class BuiltinModel:
    """A model defined in model-store/ with seeded weights."""

    name: str
    seed: int
    calibration_batches: int
    calibration_batch_size: int
    description: str

    @property
    def source(self) -> Path:
        return paths.model_store_dir() / self.name / "model.py"


BUILTINS: dict[str, BuiltinModel] = {
    "resnet50": BuiltinModel("resnet50", 50, 4, 8, "ResNet-50 architecture, 224x224, 1000 classes"),
    "tiny": BuiltinModel("tiny", 7, 4, 32, "tiny CNN for fast tests, 32x32, 10 classes"),
}


@dataclass(frozen=True)
class ModelInfo:
    """What the runner and load generator need to know about a model without importing torch."""

    name: str
    input_size: int
    num_classes: int


def get_builtin(name: str) -> BuiltinModel:
    try:
        return BUILTINS[name]
    except KeyError:
        raise ValueError(f"unknown built-in model {name!r}; choose one of {', '.join(BUILTINS)}") from None


def load_module(path: Path, name: str | None = None) -> ModuleType:
    """Import a source file that is not on the path (a model definition, a handler helper). It is
    registered in sys.modules while it runs: dataclasses look their module up as they are made."""
    spec = importlib.util.spec_from_file_location(name or f"servinglab_model_{path.parent.name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def model_info(name: str) -> ModelInfo:
    """Input size and class count of a built-in model, read from its source without running it."""
    source = get_builtin(name).source.read_text()
    values: dict[str, int] = {}
    for line in source.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("INPUT_SIZE", "NUM_CLASSES") and value.strip().isdigit():
            values[key.strip()] = int(value.strip())
    return ModelInfo(name, values["INPUT_SIZE"], values["NUM_CLASSES"])


def _archiver_version() -> str:
    from importlib.metadata import version

    return version("torch-model-archiver")


def handler_paths() -> list[Path]:
    """servinglab's handler and its helper module: packed into every archive servinglab makes."""
    return [paths.handlers_dir() / name for name in (HANDLER_FILE, *HANDLER_HELPERS)]


def input_digest(model: BuiltinModel) -> str:
    """sha256 over everything that ends up in the archive, plus the recipe that makes it."""
    digest = hashlib.sha256()
    for part in (RECIPE_VERSION, _archiver_version(), model.name, str(model.seed)):
        digest.update(part.encode() + b"\0")
    digest.update(f"{model.calibration_batches}x{model.calibration_batch_size}".encode() + b"\0")
    for path in [model.source, *handler_paths()]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def archive_dir(name: str, build_root: Path | None = None) -> Path:
    """Where the no-archive directory of `name` is (or will be) built."""
    return (build_root or paths.build_dir()) / name / name


def _known_digests(model: BuiltinModel) -> dict[str, str]:
    """The archive's files whose content this install knows on its own: the model's code and the handler."""
    return {path.name: digests.file_sha256(path) for path in [model.source, *handler_paths()]}


def build_difference(name: str, build_root: Path | None = None, folder: Path | None = None) -> str | None:
    """None when `folder` (default: the build) is exactly the build its manifest lists, with this install's
    model code and handler; else what differs."""
    archive = archive_dir(name, build_root)
    listed = digests.read_manifest(archive.parent / DIGESTS_FILE)
    if listed is None:
        return f"{archive.parent / DIGESTS_FILE} is missing or unreadable"
    return digests.difference(folder or archive, listed, _known_digests(get_builtin(name)))


def is_current(name: str, build_root: Path | None = None) -> bool:
    """Built from today's inputs, and every file still what was built."""
    model = get_builtin(name)
    stamp = archive_dir(name, build_root).parent / STAMP_FILE
    if not stamp.exists() or stamp.read_text().strip() != input_digest(model):
        return False
    return build_difference(name, build_root) is None


class BuildChanged(RuntimeError):
    """A copy of a build differs from the build's manifest: something other than servinglab changed it."""


def install(name: str, into: Path, build_root: Path | None = None) -> Path:
    """Copy the (current) build to `into` (replaced) and check the copy against the build's manifest, so
    that what a server pod serves is what was built, whatever happens to a shared cache meanwhile."""
    shutil.rmtree(into, ignore_errors=True)
    archive = archive_dir(name, build_root)
    with (archive.parent / ".lock").open("a") as lock:  # shared: no pod of ours rebuilds it meanwhile
        fcntl.flock(lock, fcntl.LOCK_SH)
        shutil.copytree(archive, into, symlinks=True)
    if (difference := build_difference(name, build_root, into)) is not None:
        shutil.rmtree(into, ignore_errors=True)
        raise BuildChanged(f"the build of {name} changed while it was copied: {difference}")
    return into


def _make_weights(model: BuiltinModel, destination: Path) -> None:
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


def build(name: str, build_root: Path | None = None, force: bool = False) -> tuple[Path, bool]:
    """Build the archive of a built-in model; return (archive directory, whether it was rebuilt)."""
    model = get_builtin(name)
    target = archive_dir(name, build_root)
    if not force and is_current(name, build_root):
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    # Server pods that share a model cache claim may build the same model at once: one builds, the
    # others wait and find it current.
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_current(name, build_root):
            return target, False
        return _build_locked(model, target), True


def _build_locked(model: BuiltinModel, target: Path) -> Path:
    name = model.name
    digest = input_digest(model)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as scratch:
        work = Path(scratch)
        _make_weights(model, work / WEIGHTS_FILE)
        # Placeholder; every experiment replaces it with its own rendered model-config.yaml.
        (work / CONFIG_FILE).write_text("minWorkers: 1\nmaxWorkers: 1\n")
        extra = ",".join(str(paths.handlers_dir() / f) for f in HANDLER_HELPERS)
        export = work / "export"
        export.mkdir()
        command = [
            *_archiver_command(),
            "--model-name", name,
            "--version", ARCHIVE_VERSION,
            "--model-file", str(model.source),
            "--serialized-file", str(work / WEIGHTS_FILE),
            "--handler", str(paths.handlers_dir() / HANDLER_FILE),
            "--extra-files", extra,
            "--config-file", str(work / CONFIG_FILE),
            "--archive-format", "no-archive",
            "--export-path", str(export),
            "--force",
        ]  # fmt: skip
        archived = subprocess.run(command, capture_output=True, text=True, check=False)
        if archived.returncode != 0:
            raise RuntimeError(f"torch-model-archiver failed for {name}:\n{archived.stderr.strip()}")
        if target.exists():
            shutil.rmtree(target)
        (export / name).rename(target)
    write_counts(name, target)
    (target.parent / STAMP_FILE).write_text(digest + "\n")
    digests.write_manifest(target, target.parent / DIGESTS_FILE, inputs=digest)  # last: the build is whole
    return target


def write_counts(name: str, archive: Path) -> dict[str, Any]:
    """Parameters and FLOPs of a built-in model, counted once (torch) and kept in its archive."""
    import torch

    from servinglab import ceiling

    network, size = ceiling.network(name)
    counts = {"parameters": sum(p.numel() for p in network.parameters()),
              "flopsPerInference": ceiling.flops_of(network, torch.zeros(1, 3, size, size))}  # fmt: skip
    (archive / COUNTS_FILE).write_text(json.dumps(counts))
    return counts


def description(name: str, archive: Path) -> dict[str, Any]:
    """What status.model says of a built-in model: its counts, kept in the (checked) build."""
    counts = json.loads((archive / COUNTS_FILE).read_text())
    return {"name": name, "source": f"built-in:{name}", "format": "builtin", **counts}


def _archiver_command() -> list[str]:
    archiver = Path(sys.executable).with_name("torch-model-archiver")
    if archiver.exists():
        return [str(archiver)]
    found = shutil.which("torch-model-archiver")
    if not found:
        raise FileNotFoundError("torch-model-archiver is not installed (pip install torch-model-archiver)")
    return [found]


def ensure_built(name: str, build_root: Path | None = None) -> Path:
    """Build in a child process when needed (keeps torch out of the caller); return the archive."""
    if is_current(name, build_root):
        return archive_dir(name, build_root)
    command = [sys.executable, "-m", "servinglab", "build-model", name, "--quiet"]
    if build_root is not None:
        command += ["--build-dir", str(build_root)]
    subprocess.run(command, check=True)
    return archive_dir(name, build_root)


def request_image_size(model: ModelRef, payload: PayloadSpec) -> int:
    """The side of the images the load generates: as the payload says, else what the model takes."""
    if payload.image_size is not None:
        return payload.image_size
    if model.source is None:
        return model_info(model.name).input_size
    return model.input.size if model.input is not None else ModelInput().size
