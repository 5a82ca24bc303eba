"""Where a built-in model's build lives, whether it is current, and how a checked copy is taken.

A build (`servinglab build-model NAME`, :mod:`.build`, run in a child process) is a plain folder: the
model's code, its seeded weights and its counts (parameters, FLOPs per inference). Every server lays its
own serving form out from it (TorchServe: its no-archive folder). A build is reused when the sha256 over
all of its inputs is unchanged and the build still is what was built: a manifest of every file's digest is
written last (:mod:`.digests`; keyed on Kubernetes, so that writing the cache is not enough to forge it) and
re-checked before reuse, as the build may sit on the model cache that server pods share; a build holds its
known files and no other. A build that differs is rebuilt; a copy that differs (:func:`install`) is refused.

Used by the servers' model preparation (locally and in a server pod's init container). No torch here.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from servinglab import paths
from servinglab.api.ceiling import ModelDescription
from servinglab.models import digests
from servinglab.models.catalogue import BuiltinModel, get_builtin, handler_paths

STAMP_FILE = "inputs.sha256"
#: The build's manifest (file -> sha256), beside the build and written after everything else.
DIGESTS_FILE = "digests.json"
WEIGHTS_FILE = "weights.pt"
MODEL_FILE = "model.py"
#: Parameters, FLOPs and bytes moved per inference, counted when the model is built (same name as a user
#: model's).
COUNTS_FILE = "servinglab-counts.json"
#: Every file a build holds, and no other: anything else (a numpy.py a server's import path would pick up)
#: means it is not a build of ours.
BUILD_FILES = (COUNTS_FILE, MODEL_FILE, WEIGHTS_FILE)
#: Bumped whenever the way builds are produced changes, so old builds are rebuilt.
RECIPE_VERSION = "3"


class BuildChanged(RuntimeError):
    """A copy of a build differs from the build's manifest: something other than servinglab changed it."""


def input_digest(model: BuiltinModel) -> str:
    """sha256 over everything that ends up in the build, plus the recipe that makes it."""
    digest = hashlib.sha256()
    for part in (RECIPE_VERSION, model.name, str(model.seed)):
        digest.update(part.encode() + b"\0")
    digest.update(f"{model.calibration_batches}x{model.calibration_batch_size}".encode() + b"\0")
    digest.update(model.source.name.encode() + b"\0" + model.source.read_bytes() + b"\0")
    return digest.hexdigest()


def build_folder(name: str, build_root: Path | None = None) -> Path:
    """Where the build of `name` is (or will be)."""
    return (build_root or paths.build_dir()) / name / name


def lock_file(name: str, build_root: Path | None = None) -> Path:
    return build_folder(name, build_root).parent / ".lock"


def _known_digests(model: BuiltinModel) -> dict[str, str]:
    """The build's files whose content this install knows on its own: the model's code."""
    return {MODEL_FILE: digests.file_sha256(model.source)}


def build_difference(name: str, build_root: Path | None = None, folder: Path | None = None) -> str | None:
    """None when `folder` (default: the build) is exactly the build its manifest lists, with this install's
    model code, a build's files and no other; else what differs. Given a cache key (:func:`digests.env_key`),
    the manifest must carry its HMAC and today's inputs: on a shared cache, whoever changes the files can
    rewrite an unkeyed manifest too."""
    build = build_folder(name, build_root)
    model = get_builtin(name)
    listed = digests.read_manifest(build.parent / DIGESTS_FILE, digests.env_key(), {"inputs": input_digest(model)})
    if listed is None:
        return f"{build.parent / DIGESTS_FILE} is missing, unreadable, of other inputs or not signed with the key"
    if set(listed) != set(BUILD_FILES):
        return f"the manifest lists {', '.join(sorted(listed))}, not a build's files ({', '.join(BUILD_FILES)})"
    return digests.difference(folder or build, listed, _known_digests(model))


def is_current(name: str, build_root: Path | None = None) -> bool:
    """Built from today's inputs, and every file still what was built."""
    model = get_builtin(name)
    stamp = build_folder(name, build_root).parent / STAMP_FILE
    if not stamp.exists() or stamp.read_text().strip() != input_digest(model):
        return False
    return build_difference(name, build_root) is None


def install(name: str, into: Path, build_root: Path | None = None) -> Path:
    """Copy the (current) build to `into` (replaced) and check the copy against the build's manifest, so
    that what a server serves is what was built, whatever happens to a shared cache meanwhile."""
    shutil.rmtree(into, ignore_errors=True)
    build = build_folder(name, build_root)
    with lock_file(name, build_root).open("a") as lock:  # shared: no pod of ours rebuilds it meanwhile
        fcntl.flock(lock, fcntl.LOCK_SH)
        shutil.copytree(build, into, symlinks=True)
    if (difference := build_difference(name, build_root, into)) is not None:
        shutil.rmtree(into, ignore_errors=True)
        raise BuildChanged(f"the build of {name} changed while it was copied: {difference}")
    return into


def ensure_built(name: str, build_root: Path | None = None) -> Path:
    """Build in a child process when needed (keeps torch out of the caller); return the build."""
    if is_current(name, build_root):
        return build_folder(name, build_root)
    command = [sys.executable, "-m", "servinglab", "build-model", name, "--quiet"]
    if build_root is not None:
        command += ["--build-dir", str(build_root)]
    subprocess.run(command, check=True)
    return build_folder(name, build_root)


def description(name: str, build: Path) -> ModelDescription:
    """What status and results say of a built-in model: its counts, kept in the (checked) build."""
    counts = json.loads((build / COUNTS_FILE).read_text())
    return ModelDescription(name=name, source=f"built-in:{name}", format="builtin", **counts)


def known_handler_digests() -> dict[str, str]:
    """servinglab's handler files by name: what a laid-out model's copy of them must be."""
    return {path.name: digests.file_sha256(path) for path in handler_paths()}


def lay_out_build(build: Path, target: Path, helpers: list[Path], link_weights: bool = False) -> None:
    """A built-in model's build (code, seeded weights, counts) and the server's `helpers` copied into
    `target`, as every server's model folder starts; `link_weights` links the weights instead of copying
    them (a local server's work folder)."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in build.iterdir():
        destination = target / entry.name
        if destination.resolve() == entry.resolve():
            continue  # laid out in place (a server pod's checked copy of the build)
        if destination.exists() or destination.is_symlink():
            destination.unlink()
        if link_weights and entry.name == WEIGHTS_FILE:
            destination.symlink_to(entry.resolve())
        else:
            shutil.copyfile(entry, destination)
    for helper in helpers:
        shutil.copyfile(helper, target / helper.name)
