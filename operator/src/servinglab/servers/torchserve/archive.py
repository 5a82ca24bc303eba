"""Models as TorchServe serves them: no-archive folders (a `MAR-INF/MANIFEST.json` naming the handler, the
serialized model and the experiment's model-config.yaml), laid out from a built-in model's build or from
the user's own model (fetched, recognised, described and counted by :mod:`servinglab.servers.usermodel`, as
on every server; laid out here).

Called by the local runner (`servinglab run`/`sweep`) and, on Kubernetes, by `servinglab prepare-model` in
the server pod's first init container. No torch here, and nothing of the user's is run or unpickled: a
packed model's parameters and FLOPs are counted by :mod:`servinglab.models.probe`, a child process, and on
Kubernetes in a second init container that has neither the cache nor any credentials (`servinglab
count-model`).

- An archive (`.mar`, or a no-archive folder) is served with its own handler, as it is; unpacking it is
  bounded by `maxBytes` (counted on the bytes written; refused early when its headers already say more)
  and by MAX_FILES, and no member may land outside the model's folder.
- A TorchScript file (`torch.jit.save`), an exported program (`torch.export.save`, `.pt2`) or an ONNX
  model (`.onnx`, run in ONNX Runtime) is packed with servinglab's handler (so every precision works, fp32
  and tf32 for ONNX) and the declared input (`servinglab-input.json`).

The folder is laid out from the work folder's own, checked copy every time (packing is a rename and a few
small files): nothing laid out is reused from the shared cache, which keeps only downloads (re-hashed on
reuse) and, for local runs, the counts of a packed model, as data.
Each failure is a :class:`ModelSourceError` with a reason of its own and a message naming the source.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from servinglab.api import ModelFormat, ModelRef, ModelSource, Precision
from servinglab.api.reasons import Reason
from servinglab.api.servers import capabilities
from servinglab.models.builtins import MODEL_FILE, WEIGHTS_FILE, lay_out_build
from servinglab.models.catalogue import HANDLER_FILE, handler_paths
from servinglab.models.fetch import (
    AUTHORIZATION_ENV,
    MAX_FILES,
    Fetched,
    ModelSourceError,
    cache_dir,
    copy_counted,
    too_large,
)
from servinglab.servers.torchserve.config import ARCHIVE_VERSION
from servinglab.servers.usermodel import LayOut, PreparedModel, Staged, recognise, stage_packed
from servinglab.servers.usermodel import prepare as lay_out_user_model

__all__ = [
    "AUTHORIZATION_ENV", "FORMATS", "Fetched", "ModelSourceError", "PreparedModel", "cache_dir", "layout_builtin",
    "prepare", "recognise",
]  # fmt: skip

#: The per-experiment model configuration, in the model's folder.
CONFIG_FILE = "model-config.yaml"
#: The user's model formats TorchServe serves (its declaration): servinglab's handler's, and archives with their
#: own handler.
FORMATS = capabilities("torchserve").user_model_formats
#: A MAR-INF/MANIFEST.json is a few hundred bytes; one larger than this is not read into memory.
_MANIFEST_MAX_BYTES = 1 << 20


def _adopt_archive(directory: Path, name: str) -> tuple[str, str | None]:
    """(the archive's handler, the config file it named) after pointing its manifest at
    model-config.yaml, which the runner renders from the experiment (batch size, delay, workers,
    precision): TorchServe reads batching settings only from the file the manifest names. The manifest's
    model name becomes the experiment's: TorchServe registers the model under the manifest's name, and
    everything that asks after it (readiness, the load failure, the requests) uses the experiment's."""
    manifest_path = directory / "MAR-INF" / "MANIFEST.json"
    try:
        if manifest_path.stat().st_size > _MANIFEST_MAX_BYTES:
            raise ValueError(f"more than {_MANIFEST_MAX_BYTES} bytes")
        manifest = json.loads(manifest_path.read_text())
        handler, own = str(manifest["model"]["handler"]), manifest["model"].get("configFile")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelSourceError(
            Reason.MODEL_NOT_RECOGNIZED, f"{directory}: unreadable MAR-INF/MANIFEST.json ({exc})"
        ) from None
    manifest["model"]["configFile"] = "model-config.yaml"
    manifest["model"]["modelName"] = name
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return handler, str(own) if own else None


def _member_path(source: ModelSource, target: Path, name: str) -> Path:
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not parts or name.startswith(("/", "\\")) or ".." in parts or parts[0].endswith(":"):
        raise ModelSourceError(Reason.MODEL_NOT_RECOGNIZED, f"{source.describe()}: the archive member {name!r} "
                               "would land outside the model's folder")  # fmt: skip
    return target.joinpath(*parts)


def _extract(source: ModelSource, archive_path: Path, target: Path) -> None:
    """Unpack a zip into `target`, bounded: refused at once when its headers already say more than
    maxBytes or MAX_FILES, and counted on the bytes written (a header that lies costs at most maxBytes)."""
    target.mkdir(parents=True)
    try:
        with zipfile.ZipFile(archive_path) as archive:
            members = archive.infolist()
            if len(members) > MAX_FILES:
                raise too_large(source, f"the archive holds {len(members)} files (at most {MAX_FILES})")
            declared = sum(member.file_size for member in members)
            if declared > source.max_bytes:
                raise too_large(source, f"the archive unpacks to {declared} bytes, as its headers say")
            written = 0
            for member in members:
                destination = _member_path(source, target, member.filename)
                if member.is_dir():
                    destination.mkdir(parents=True, exist_ok=True)
                    continue
                destination.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as stream, destination.open("xb") as out:
                    written += copy_counted(stream, out, source, written)[1]
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, FileExistsError) as exc:
        raise ModelSourceError(Reason.MODEL_NOT_RECOGNIZED, f"{source.describe()}: a damaged or unsupported zip "
                               f"archive ({type(exc).__name__}: {exc})") from None  # fmt: skip


def _lay_out(model: ModelRef, precision: Precision) -> LayOut:
    def lay_out(source: ModelSource, fetched: Fetched, fmt: ModelFormat, target: Path) -> Staged:
        """`target` (absent) as a no-archive model directory from the work folder's copy (moved in: the work
        folder is beside `target`, on the same file system)."""
        if fmt is ModelFormat.DIRECTORY:
            os.replace(fetched.path, target)
        elif fmt is ModelFormat.MAR:
            _extract(source, fetched.path, target)
        else:
            serialized = stage_packed(fetched, fmt, target, model.input)
            for helper in handler_paths():
                shutil.copyfile(helper, target / helper.name)
            write_manifest(target, model.name, serialized)
            return Staged(target)
        return Staged(target, _adopted(source, target, model.name, precision))

    return lay_out


def write_manifest(target: Path, name: str, serialized: str, model_file: str | None = None) -> None:
    """The no-archive folder's manifest: servinglab's handler, the serialized model, and the experiment's
    model-config.yaml (without it TorchServe ignores the experiment's batching and workers)."""
    model: dict[str, str] = {
        "modelName": name,
        "serializedFile": serialized,
        "handler": HANDLER_FILE,
        "modelVersion": ARCHIVE_VERSION,
        "configFile": CONFIG_FILE,
    }
    if model_file is not None:
        model["modelFile"] = model_file
    (target / "MAR-INF").mkdir(exist_ok=True)
    manifest = {"runtime": "python", "model": model, "archiverVersion": "servinglab"}
    (target / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))


def layout_builtin(name: str, build: Path, target: Path, link_weights: bool = False) -> Path:
    """A built-in model's build (code, seeded weights, counts) as a no-archive folder at `target`: the build's
    files, servinglab's handler, the manifest and a placeholder model-config.yaml (every experiment writes
    its own). `link_weights` links the weights instead of copying them (a local server's work folder)."""
    lay_out_build(build, target, handler_paths(), link_weights)
    write_manifest(target, name, WEIGHTS_FILE, MODEL_FILE)
    (target / CONFIG_FILE).write_text("minWorkers: 1\nmaxWorkers: 1\n")
    return target


def prepare(model: ModelRef, precision: Precision, target: Path, authorization: str | None = None,
            mounted: Path | None = None, cache: Path | None = None, count: bool = True,
            batch_size: int = 1) -> PreparedModel:  # fmt: skip
    """The user's model fetched, checked and laid out at `target` for TorchServe (:func:`lay_out_user_model`,
    which says what `mounted`, `cache`, `count` and `batch_size` do); raises :class:`ModelSourceError`."""
    return lay_out_user_model(model, target, _lay_out(model, precision), "TorchServe", FORMATS, authorization, mounted,
                             cache, count, precision, batch_size)  # fmt: skip


def _adopted(source: ModelSource, target: Path, name: str, precision: Precision) -> dict[str, str]:
    """What the description says of an archive served with its own handler; refuses a precision that handler
    cannot run."""
    handler, replaced = _adopt_archive(target, name)
    info = {"handler": handler}
    if replaced:
        info["archiveConfigReplaced"] = replaced
    if handler != HANDLER_FILE and precision is not Precision.FP32:
        raise ModelSourceError(
            Reason.PRECISION_NOT_SUPPORTED,
            f"{source.describe()}: this archive brings its own handler ({handler}), which servinglab cannot "
            f"switch to {precision}; serve it at fp32, or give the TorchScript/.pt2 model file instead",
        )
    return info
