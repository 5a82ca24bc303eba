"""Models as TorchServe serves them: no-archive folders (a `MAR-INF/MANIFEST.json` naming the handler, the
serialized model and the experiment's model-config.yaml), laid out from a built-in model's build or from
the user's own model, which is recognised, checked and laid out here (the second half of preparing it;
:mod:`servinglab.models.fetch` fetches).

Called by the local runner (`servinglab run`/`sweep`) and, on Kubernetes, by `servinglab prepare-model` in
the server pod's first init container. No torch here, and nothing of the user's is run or unpickled: a
packed model's parameters and FLOPs are counted by :mod:`servinglab.models.probe`, a child process, and on
Kubernetes in a second init container that has neither the cache nor any credentials (`servinglab
count-model`).

- An archive (`.mar`, or a no-archive folder) is served with its own handler, as it is; unpacking it is
  bounded by `maxBytes` (counted on the bytes written; refused early when its headers already say more)
  and by MAX_FILES, and no member may land outside the model's folder.
- A TorchScript file (`torch.jit.save`) or an exported program (`torch.export.save`, `.pt2`) is packed
  with servinglab's handler (so every precision works) and the declared input (`servinglab-input.json`).

The folder is laid out from the work folder's own, checked copy every time (packing is a rename and a few
small files): nothing laid out is reused from the shared cache, which keeps only downloads (re-hashed on
reuse) and, for local runs, the counts of a packed model, as data.
Each failure is a :class:`ModelSourceError` with a reason of its own and a message naming the source.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from servinglab.api import ModelFormat, ModelInput, ModelRef, ModelSource, Precision
from servinglab.models import probe as modelprobe
from servinglab.models.builtins import MODEL_FILE, WEIGHTS_FILE, lay_out_build
from servinglab.models.catalogue import HANDLER_FILE, INFO_FILE, INPUT_FILE, handler_paths
from servinglab.models.fetch import (
    AUTHORIZATION_ENV,
    MAX_FILES,
    Fetched,
    ModelSourceError,
    cache_dir,
    copy_counted,
    copy_folder,
    download,
    take_file,
    too_large,
)
from servinglab.servers.torchserve.config import ARCHIVE_VERSION

__all__ = [
    "AUTHORIZATION_ENV", "Fetched", "ModelSourceError", "PreparedModel", "cache_dir", "layout_builtin", "prepare",
    "recognise",
]  # fmt: skip

#: The per-experiment model configuration, in the model's folder.
CONFIG_FILE = "model-config.yaml"

_SERIALIZED = {ModelFormat.TORCHSCRIPT: "model.pt", ModelFormat.EXPORTED: "model.pt2"}
PACKED = tuple(_SERIALIZED)
#: A MAR-INF/MANIFEST.json is a few hundred bytes; one larger than this is not read into memory.
_MANIFEST_MAX_BYTES = 1 << 20


@dataclass
class PreparedModel:
    """A no-archive folder TorchServe can serve, and what status and results say about it."""

    directory: Path
    info: dict[str, Any] = field(default_factory=dict)


def _zip_names(path: Path) -> list[str] | None:
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as archive:
        return archive.namelist()


def recognise(source: ModelSource, fetched: Fetched) -> ModelFormat:
    """What the file or folder is: by content where it tells, else by name; never what it is not."""
    what = source.describe()
    if fetched.path.is_dir():
        if not (fetched.path / "MAR-INF" / "MANIFEST.json").is_file():
            raise ModelSourceError("ModelNotRecognized", f"{what}: a folder without MAR-INF/MANIFEST.json")
        return ModelFormat.DIRECTORY
    names = _zip_names(fetched.path)
    if names is None:
        raise ModelSourceError(
            "ModelNotRecognized",
            f"{what}: not a zip file, so neither a .mar archive, a TorchScript file nor an exported program (.pt2)",
        )
    if "MAR-INF/MANIFEST.json" in names:
        found = ModelFormat.MAR
    elif any(n.endswith("serialized_exported_program.json") or n.endswith("/models/model.json") for n in names):
        found = ModelFormat.EXPORTED
    elif any(n.endswith("/constants.pkl") for n in names) and any("/code/" in n for n in names):
        found = ModelFormat.TORCHSCRIPT
    else:
        raise ModelSourceError(
            "ModelNotRecognized",
            f"{what}: a zip file but not a .mar archive (no MAR-INF/MANIFEST.json), a TorchScript file "
            "or an exported program; a plain state dict (torch.save) cannot be served: save the module "
            "with torch.jit.save or torch.export.save",
        )
    declared = source.format
    if declared not in (ModelFormat.AUTO, found):
        raise ModelSourceError("ModelNotRecognized", f"{what}: format is {declared}, but the file is {found}")
    return found


def _adopt_archive(directory: Path) -> tuple[str, str | None]:
    """(the archive's handler, the config file it named) after pointing its manifest at
    model-config.yaml, which the runner renders from the experiment (batch size, delay, workers,
    precision): TorchServe reads batching settings only from the file the manifest names."""
    manifest_path = directory / "MAR-INF" / "MANIFEST.json"
    try:
        if manifest_path.stat().st_size > _MANIFEST_MAX_BYTES:
            raise ValueError(f"more than {_MANIFEST_MAX_BYTES} bytes")
        manifest = json.loads(manifest_path.read_text())
        handler, own = str(manifest["model"]["handler"]), manifest["model"].get("configFile")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelSourceError("ModelNotRecognized", f"{directory}: unreadable MAR-INF/MANIFEST.json ({exc})") from None
    manifest["model"]["configFile"] = "model-config.yaml"
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return handler, str(own) if own else None


def _member_path(source: ModelSource, target: Path, name: str) -> Path:
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not parts or name.startswith(("/", "\\")) or ".." in parts or parts[0].endswith(":"):
        raise ModelSourceError("ModelNotRecognized", f"{source.describe()}: the archive member {name!r} would land "
                               "outside the model's folder")  # fmt: skip
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
        raise ModelSourceError("ModelNotRecognized", f"{source.describe()}: a damaged or unsupported zip archive "
                               f"({type(exc).__name__}: {exc})") from None  # fmt: skip


def _stage(source: ModelSource, fetched: Fetched, fmt: ModelFormat, target: Path, name: str,
           model_input: ModelInput | None) -> None:  # fmt: skip
    """Lay out `target` (absent) as a no-archive model directory from the work folder's copy (moved in:
    the work folder is beside `target`, on the same file system)."""
    if fmt is ModelFormat.DIRECTORY:
        os.replace(fetched.path, target)
        return
    if fmt is ModelFormat.MAR:
        _extract(source, fetched.path, target)
        return
    target.mkdir(parents=True)
    serialized = _SERIALIZED[fmt]
    os.replace(fetched.path, target / serialized)
    for helper in handler_paths():
        shutil.copyfile(helper, target / helper.name)
    write_manifest(target, name, serialized)
    declared = (model_input or ModelInput()).model_dump(by_alias=True)
    (target / INPUT_FILE).write_text(json.dumps({"format": str(fmt), **declared}, indent=2))


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


def _handler_digest() -> str:
    digest = hashlib.sha256()
    for helper in handler_paths():
        digest.update(helper.read_bytes())
    return digest.hexdigest()[:16]


def _fetch(source: ModelSource, scratch: Path, authorization: str | None, mounted: Path | None,
           cache: Path | None) -> Fetched:  # fmt: skip
    if source.url is not None:
        return download(source, scratch, cache, authorization or os.environ.get(AUTHORIZATION_ENV))
    if source.pvc is not None:
        if mounted is None:
            raise ModelSourceError("ModelDownloadFailed", f"{source.describe()}: a claim is read on Kubernetes only")
        path = mounted / source.pvc.path
        if not path.resolve().is_relative_to(mounted.resolve()):
            raise ModelSourceError("ModelDownloadFailed", f"{source.describe()}: a symlink that leaves the claim")
    else:
        path = Path(str(source.path)).expanduser()
    if path.is_dir():
        if source.sha256 is not None:
            raise ModelSourceError(
                "ModelChecksumMismatch",
                f"{source.describe()}: sha256 is given, but this is a folder, which has no single digest; "
                "give a file's (.mar, .pt, .pt2) or none",
            )
        return copy_folder(source, path, scratch / "folder")
    return take_file(source, path, scratch / (path.name or "model"))


def prepare(model: ModelRef, precision: Precision, target: Path, authorization: str | None = None,
            mounted: Path | None = None, cache: Path | None = None, count: bool = True) -> PreparedModel:  # fmt: skip
    """Fetch, check, recognise and lay out the model at `target` (replaced); raises :class:`ModelSourceError`.

    Its work folder is beside `target` and removed before this returns. `mounted` is where a pvc source's
    claim is mounted (the init container); `cache` keeps downloads by digest (None: nowhere). With `count`,
    a packed model's parameters and FLOPs are counted here (a child process that loads it; kept in the cache
    as data); without, `servinglab count-model` counts them where nothing else is at stake."""
    source = model.source
    assert source is not None, "built-in models are laid out by layout_builtin"
    scratch = target.parent / f".scratch-{target.name}"
    for folder in (target, scratch):
        shutil.rmtree(folder, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        fetched = _fetch(source, scratch, authorization, mounted, cache)
        fmt = recognise(source, fetched)
        _stage(source, fetched, fmt, target, model.name, model.input)
        info = _describe(model, fetched, fmt, target, precision)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (target / INFO_FILE).write_text(json.dumps(info, indent=2))
    if fmt in PACKED:
        info["input"] = json.loads((target / INPUT_FILE).read_text())
        if count:
            declared = (model.input or ModelInput()).model_dump()
            key = hashlib.sha256(json.dumps([fetched.sha256, str(fmt), _handler_digest(), declared]).encode())
            info.update(_counts(target, cache / "counts" / f"{key.hexdigest()}.json" if cache is not None else None))
    return PreparedModel(target, info)


def _describe(
    model: ModelRef, fetched: Fetched, fmt: ModelFormat, target: Path, precision: Precision
) -> dict[str, Any]:
    """What status and results say of the model; refuses a precision an archive's own handler cannot run."""
    source = model.source
    assert source is not None
    info: dict[str, Any] = {
        "name": model.name,
        "source": source.describe(),
        "format": str(fmt),
        "sha256": fetched.sha256,
        "sizeBytes": fetched.size_bytes,
        "downloaded": fetched.downloaded,
        "handler": HANDLER_FILE,
    }
    if fmt in PACKED:
        return info
    handler, replaced = _adopt_archive(target)
    info["handler"] = handler
    if replaced:
        info["archiveConfigReplaced"] = replaced
    if handler != HANDLER_FILE and precision is not Precision.FP32:
        raise ModelSourceError(
            "PrecisionNotSupported",
            f"{source.describe()}: this archive brings its own handler ({handler}), which servinglab cannot "
            f"switch to {precision}; serve it at fp32, or give the TorchScript/.pt2 model file instead",
        )
    return info


def _counts(directory: Path, kept: Path | None) -> dict[str, Any]:
    """The packed model's counts: kept ones (data, checked like a fresh answer), else counted by loading it."""
    if kept is not None and kept.is_file():
        with contextlib.suppress(OSError, ValueError):
            if (counts := modelprobe.checked(json.loads(kept.read_text()))) is not None:
                return counts
    counts = modelprobe.count(directory)
    if kept is not None and counts.get("parameters") is not None:  # a failed count may succeed next time
        with contextlib.suppress(OSError):
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps(counts))
    return counts
