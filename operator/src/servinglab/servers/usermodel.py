"""Preparing a user's own model for any server (the seam's shared part, beside :mod:`.podparts`): fetched
(:mod:`servinglab.models.fetch`), recognised by its content, laid out by the server in its own serving form,
described and counted. The server-neutral half of every server's
`prepare_user_model`; the server gives the formats it serves and a function that lays the model out.

- A TorchScript file (`torch.jit.save`), an exported program (`torch.export.save`, `.pt2`) or an ONNX model
  (`.onnx`, run in ONNX Runtime) runs with servinglab's handler on every server: :func:`stage_packed` puts
  it, renamed `model.pt`/`model.pt2`/`model.onnx`, in the folder the server names, beside its declared
  input (`servinglab-input.json`), which the handler's `load()` reads. So loading, the precision conversion
  and inference are the handler's, whichever server.
- An archive (`.mar`, or a no-archive folder) brings its own handler: only a server whose formats name it
  lays it out; any other refuses it with ModelNotSupported, before anything starts.

No torch here, and nothing of the user's is run or unpickled: an ONNX model is parsed and checked
(:mod:`servinglab.models.onnxcheck`: external data, operator domains, its input against `model.input` and
the batch size, the precision) before it is laid out; a packed model is counted by :mod:`.probe`, a child
process. Each failure is a :class:`ModelSourceError` with its reason and a message
naming the source.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servinglab.api import ModelFormat, ModelInput, ModelRef, ModelSource, Precision
from servinglab.api.reasons import Reason
from servinglab.models import onnxcheck
from servinglab.models import probe as modelprobe
from servinglab.models.catalogue import HANDLER_FILE, INFO_FILE, INPUT_FILE, handler_paths
from servinglab.models.fetch import AUTHORIZATION_ENV, Fetched, ModelSourceError, copy_folder, download, take_file

#: The formats servinglab's handler runs (every server serves them), by the name the packed file gets.
SERIALIZED = {ModelFormat.TORCHSCRIPT: "model.pt", ModelFormat.EXPORTED: "model.pt2", ModelFormat.ONNX: "model.onnx"}
PACKED = tuple(SERIALIZED)
_ARCHIVES = (ModelFormat.MAR, ModelFormat.DIRECTORY)
#: The reason a server that cannot serve a model's format refuses it with.
NOT_SUPPORTED = Reason.MODEL_NOT_SUPPORTED


@dataclass
class PreparedModel:
    """A user's model laid out for a server, and what status and results say about it."""

    directory: Path
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Staged:
    """What a server's layout gives back: the folder that holds the model (its declared input and its
    description go there; the probe counts it there) and what it adds to the description."""

    folder: Path
    info: dict[str, Any] = field(default_factory=dict)


#: A server's layout of a fetched, recognised model at a target folder (absent when called).
LayOut = Callable[[ModelSource, Fetched, ModelFormat, Path], Staged]


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
            raise ModelSourceError(Reason.MODEL_NOT_RECOGNIZED, f"{what}: a folder without MAR-INF/MANIFEST.json")
        return ModelFormat.DIRECTORY
    names = _zip_names(fetched.path)
    if names is None and onnxcheck.parse(fetched.path) is not None:
        found = ModelFormat.ONNX
    elif names is None:
        named = " (named .onnx, but not an ONNX ModelProto)" if fetched.path.name.endswith(".onnx") else ""
        raise ModelSourceError(
            Reason.MODEL_NOT_RECOGNIZED,
            f"{what}: neither a zip file nor an ONNX model{named}, so not a .mar archive, a TorchScript file, an "
            "exported program (.pt2) or an ONNX model (.onnx)",
        )
    elif "MAR-INF/MANIFEST.json" in names:
        found = ModelFormat.MAR
    elif any(n.endswith("serialized_exported_program.json") or n.endswith("/models/model.json") for n in names):
        found = ModelFormat.EXPORTED
    elif any(n.endswith("/constants.pkl") for n in names) and any("/code/" in n for n in names):
        found = ModelFormat.TORCHSCRIPT
    else:
        raise ModelSourceError(
            Reason.MODEL_NOT_RECOGNIZED,
            f"{what}: a zip file but not a .mar archive (no MAR-INF/MANIFEST.json), a TorchScript file "
            "or an exported program; a plain state dict (torch.save) cannot be served: save the module "
            "with torch.jit.save or torch.export.save",
        )
    declared = source.format
    if declared not in (ModelFormat.AUTO, found):
        raise ModelSourceError(Reason.MODEL_NOT_RECOGNIZED, f"{what}: format is {declared}, but the file is {found}")
    return found


def stage_packed(fetched: Fetched, fmt: ModelFormat, folder: Path, model_input: ModelInput | None) -> str:
    """The work folder's copy moved into `folder` (created) as `model.pt`/`model.pt2`, beside its declared
    input; the packed file's name (what the handler's `load()` is given)."""
    folder.mkdir(parents=True)
    serialized = SERIALIZED[fmt]
    os.replace(fetched.path, folder / serialized)
    declared = (model_input or ModelInput()).model_dump(by_alias=True)
    (folder / INPUT_FILE).write_text(json.dumps({"format": str(fmt), **declared}, indent=2))
    return serialized


def fetch(source: ModelSource, scratch: Path, authorization: str | None, mounted: Path | None,
          cache: Path | None) -> Fetched:  # fmt: skip
    """The source brought into `scratch`: downloaded, read from the mounted claim or from a local path."""
    if source.url is not None:
        return download(source, scratch, cache, authorization or os.environ.get(AUTHORIZATION_ENV))
    if source.pvc is not None:
        if mounted is None:
            raise ModelSourceError(
                Reason.MODEL_DOWNLOAD_FAILED, f"{source.describe()}: a claim is read on Kubernetes only"
            )
        path = mounted / source.pvc.path
        if not path.resolve().is_relative_to(mounted.resolve()):
            raise ModelSourceError(
                Reason.MODEL_DOWNLOAD_FAILED, f"{source.describe()}: a symlink that leaves the claim"
            )
    else:
        path = Path(str(source.path)).expanduser()
    if path.is_dir():
        if source.sha256 is not None:
            raise ModelSourceError(
                Reason.MODEL_CHECKSUM_MISMATCH,
                f"{source.describe()}: sha256 is given, but this is a folder, which has no single digest; "
                "give a file's (.mar, .pt, .pt2) or none",
            )
        return copy_folder(source, path, scratch / "folder")
    return take_file(source, path, scratch / (path.name or "model"))


def _refuse_format(source: ModelSource, fmt: ModelFormat, server: str, formats: Sequence[ModelFormat]) -> None:
    if fmt not in formats:
        served = " or ".join(str(f) for f in formats)
        raise ModelSourceError(
            NOT_SUPPORTED,
            f"{source.describe()}: {server} does not serve a {fmt} model"
            f"{' (an archive brings its own handler, which only TorchServe runs)' if fmt in _ARCHIVES else ''}; "
            f"it serves a user's model given as {served} (torch.jit.save, torch.export.save or torch.onnx.export "
            "of the module)",
        )


def prepare(model: ModelRef, target: Path, lay_out: LayOut, server: str, formats: Sequence[ModelFormat],
            authorization: str | None = None, mounted: Path | None = None, cache: Path | None = None,
            count: bool = True, precision: Precision | None = None, batch_size: int = 1) -> PreparedModel:  # fmt: skip
    """Fetch, check, recognise and lay out (`lay_out`, the server's) the model at `target` (replaced); a format
    outside `formats` is refused, and an ONNX model the handler cannot run at `precision` and `batch_size`
    (:func:`onnxcheck.check`). Raises :class:`ModelSourceError`.

    Its work folder is beside `target` and removed before this returns. `mounted` is where a pvc source's
    claim is mounted (the init container); `cache` keeps downloads by digest (None: nowhere). With `count`,
    a packed model's parameters and FLOPs are counted here (a child process that loads it; kept in the cache
    as data); without, `servinglab count-model` counts them where nothing else is at stake."""
    source = model.source
    assert source is not None, "built-in models are laid out from their build"
    scratch = target.parent / f".scratch-{target.name}"
    for folder in (target, scratch):
        shutil.rmtree(folder, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        fetched = fetch(source, scratch, authorization, mounted, cache)
        fmt = recognise(source, fetched)
        _refuse_format(source, fmt, server, formats)
        if fmt is ModelFormat.ONNX:
            onnxcheck.check(source, fetched.path, model.input, precision, batch_size)
        staged = lay_out(source, fetched, fmt, target)
        info: dict[str, Any] = {
            "name": model.name, "source": source.describe(), "format": str(fmt), "sha256": fetched.sha256,
            "sizeBytes": fetched.size_bytes, "downloaded": fetched.downloaded, "handler": HANDLER_FILE,
            **staged.info,
        }  # fmt: skip
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (staged.folder / INFO_FILE).write_text(json.dumps(info, indent=2))
    if fmt in PACKED:
        info["input"] = json.loads((staged.folder / INPUT_FILE).read_text())
        if count:
            declared = (model.input or ModelInput()).model_dump()
            key = hashlib.sha256(json.dumps([fetched.sha256, str(fmt), _handler_digest(), declared]).encode())
            kept = cache / "counts" / f"{key.hexdigest()}.json" if cache is not None else None
            info.update(_counts(staged.folder, kept))
    return PreparedModel(target, info)


def _handler_digest() -> str:
    digest = hashlib.sha256()
    for helper in handler_paths():
        digest.update(helper.read_bytes())
    return digest.hexdigest()[:16]


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
