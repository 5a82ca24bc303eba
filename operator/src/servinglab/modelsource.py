"""The user's own model: fetch it (URL, local path, mounted claim), check it, recognise it, and lay it
out as a TorchServe no-archive directory ready to serve.

Called by the local runner (`servinglab run`/`sweep`) and, on Kubernetes, by `servinglab
prepare-model` in the server pod's init container. No torch here: a packed model's parameters and
FLOPs are counted by :mod:`servinglab.modelprobe`, a child process, and kept with it.

- An archive (`.mar`, or a no-archive folder) is served with its own handler, as it is.
- A TorchScript file (`torch.jit.save`) or an exported program (`torch.export.save`, `.pt2`) is packed
  with servinglab's handler (so every precision works) and the declared input
  (`servinglab-input.json`).

Files are kept in a cache by sha256 (`<cache>/<sha256>/`): a URL whose expected sha256 is given and
already cached is not downloaded again, and a packed folder is reused when its inputs match.
Each failure is a :class:`ModelSourceError` with a reason of its own and a message naming the source.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servinglab import modelprobe, models
from servinglab.api import ModelFormat, ModelInput, ModelRef, ModelSource, Precision

#: Written into every folder this module lays out: what was served and where it came from.
INFO_FILE = "servinglab-model.json"
#: The declared input, read by servinglab's handler in a packed model.
INPUT_FILE = "servinglab-input.json"
#: Authorization header value for a URL source (from a Secret, in the fetching init container only).
AUTHORIZATION_ENV = "SERVINGLAB_MODEL_AUTHORIZATION"
DOWNLOAD_TIMEOUT_SECONDS = 60.0
_CHUNK = 1 << 20
_SERIALIZED = {ModelFormat.TORCHSCRIPT: "model.pt", ModelFormat.EXPORTED: "model.pt2"}
_EXTENSIONS = {
    ".mar": ModelFormat.MAR,
    ".pt2": ModelFormat.EXPORTED,
    ".pt": ModelFormat.TORCHSCRIPT,
    ".pth": ModelFormat.TORCHSCRIPT,
    ".ts": ModelFormat.TORCHSCRIPT,
    ".torchscript": ModelFormat.TORCHSCRIPT,
}


class ModelSourceError(RuntimeError):
    """The model cannot be served; `reason` is the condition reason the experiment ends with."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Fetched:
    """A source brought onto this machine: a file or folder, with its digest (files only) and size."""

    path: Path
    sha256: str | None
    size_bytes: int
    downloaded: bool = False


@dataclass
class PreparedModel:
    """A no-archive folder TorchServe can serve, and what status and results say about it."""

    directory: Path
    info: dict[str, Any] = field(default_factory=dict)


def cache_dir() -> Path:
    override = os.environ.get("SERVINGLAB_MODEL_CACHE")
    if override:
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servinglab" / "models"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _file_name(url: str) -> str:
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return name or "model"


def _checked(source: ModelSource, path: Path, digest: str) -> None:
    if source.sha256 is not None and digest != source.sha256:
        raise ModelSourceError(
            "ModelChecksumMismatch",
            f"{source.describe()}: sha256 is {digest}, the spec expects {source.sha256}",
        )


def download(source: ModelSource, cache: Path, authorization: str | None = None) -> Fetched:
    """The URL's file in the cache, downloaded unless the expected digest is already there."""
    assert source.url is not None
    name = _file_name(source.url)
    if source.sha256 is not None:
        cached = cache / source.sha256 / name
        if cached.is_file():
            return Fetched(cached, source.sha256, cached.stat().st_size)
    cache.mkdir(parents=True, exist_ok=True)
    request = urllib.request.Request(source.url, headers={"User-Agent": "servinglab"})
    if authorization:
        request.add_header("Authorization", authorization)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=cache, prefix=".download-", delete=False) as partial:
        try:
            with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response:
                while chunk := response.read(_CHUNK):
                    digest.update(chunk)
                    partial.write(chunk)
        except urllib.error.HTTPError as exc:
            Path(partial.name).unlink(missing_ok=True)
            raise ModelSourceError("ModelDownloadFailed", f"{source.url}: HTTP {exc.code} {exc.reason}") from None
        except (OSError, ValueError) as exc:
            Path(partial.name).unlink(missing_ok=True)
            raise ModelSourceError("ModelDownloadFailed", f"{source.url}: {exc}") from None
    sha256 = digest.hexdigest()
    try:
        _checked(source, Path(partial.name), sha256)
    except ModelSourceError:
        Path(partial.name).unlink(missing_ok=True)
        raise
    target = cache / sha256 / name
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial.name, target)
    return Fetched(target, sha256, target.stat().st_size, downloaded=True)


def local(source: ModelSource, path: Path) -> Fetched:
    """A file or folder already on this machine (a local path, or a claim mounted into the pod)."""
    if not path.exists():
        raise ModelSourceError("ModelDownloadFailed", f"{source.describe()}: no such file or folder")
    if path.is_dir():
        return Fetched(path, None, _size(path))
    sha256 = file_sha256(path)
    _checked(source, path, sha256)
    return Fetched(path, sha256, path.stat().st_size)


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
        manifest = json.loads(manifest_path.read_text())
        handler, own = str(manifest["model"]["handler"]), manifest["model"].get("configFile")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelSourceError("ModelNotRecognized", f"{directory}: unreadable MAR-INF/MANIFEST.json ({exc})") from None
    manifest["model"]["configFile"] = "model-config.yaml"
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return handler, str(own) if own else None


def _stage(fetched: Fetched, fmt: ModelFormat, target: Path, name: str, model_input: ModelInput | None) -> None:
    """Lay out `target` (a fresh folder) as a no-archive model directory."""
    if fmt is ModelFormat.DIRECTORY:
        shutil.copytree(fetched.path, target, symlinks=False)
        return
    if fmt is ModelFormat.MAR:
        with zipfile.ZipFile(fetched.path) as archive:
            archive.extractall(target)
        return
    target.mkdir(parents=True)
    serialized = _SERIALIZED[fmt]
    shutil.copyfile(fetched.path, target / serialized)
    for helper in models.handler_paths():
        shutil.copyfile(helper, target / helper.name)
    (target / "MAR-INF").mkdir()
    manifest = {
        "runtime": "python",
        "model": {
            "modelName": name,
            "serializedFile": serialized,
            "handler": models.HANDLER_FILE,
            "modelVersion": "1.0",
            "configFile": "model-config.yaml",  # without it TorchServe ignores the experiment's settings
        },
        "archiverVersion": "servinglab",
    }
    (target / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))
    declared = (model_input or ModelInput()).model_dump(by_alias=True)
    (target / INPUT_FILE).write_text(json.dumps({"format": str(fmt), **declared}, indent=2))


def _handler_digest() -> str:
    digest = hashlib.sha256()
    for helper in models.handler_paths():
        digest.update(helper.read_bytes())
    return digest.hexdigest()[:16]


def prepare(model: ModelRef, precision: Precision, workdir: Path, authorization: str | None = None,
            mounted: Path | None = None, cache: Path | None = None) -> PreparedModel:  # fmt: skip
    """Fetch, check, recognise and lay out the model (a packed one with its parameters and FLOPs);
    raises :class:`ModelSourceError`.

    An archive is unpacked under `workdir`; `mounted` is where a pvc source's claim is mounted (the
    init container); `cache` defaults to :func:`cache_dir`. A packed folder is reused when the file
    digest, the format, the declared input and servinglab's handler all match (its cache key)."""
    source = model.source
    assert source is not None, "built-in models are built by servinglab.models"
    cache = cache or cache_dir()
    if source.url is not None:
        fetched = download(source, cache / "files", authorization or os.environ.get(AUTHORIZATION_ENV))
    elif source.pvc is not None:
        if mounted is None:
            raise ModelSourceError("ModelDownloadFailed", f"{source.describe()}: a claim is read on Kubernetes only")
        fetched = local(source, mounted / source.pvc.path)
    else:
        fetched = local(source, Path(str(source.path)).expanduser())
    fmt = recognise(source, fetched)
    packed = fmt in (ModelFormat.TORCHSCRIPT, ModelFormat.EXPORTED)
    info: dict[str, Any] = {
        "name": model.name,
        "source": source.describe(),
        "format": str(fmt),
        "sha256": fetched.sha256,
        "sizeBytes": fetched.size_bytes,
        "downloaded": fetched.downloaded,
        "handler": models.HANDLER_FILE if packed else None,
    }
    if packed:
        key = hashlib.sha256(json.dumps([fetched.sha256, str(fmt), model.name, _handler_digest(),
                                         (model.input or ModelInput()).model_dump()]).encode()).hexdigest()  # fmt: skip
        directory = cache / "packed" / key
        if not (directory / INFO_FILE).is_file():
            staging = Path(tempfile.mkdtemp(dir=_ensure(cache / "packed"), prefix=".staging-"))
            _stage(fetched, fmt, staging / "model", model.name, model.input)
            (staging / "model" / INFO_FILE).write_text(json.dumps(info, indent=2))
            try:
                os.replace(staging / "model", directory)
            except OSError:  # another pod sharing the cache packed it first: the same content
                if not (directory / INFO_FILE).is_file():
                    raise
            shutil.rmtree(staging, ignore_errors=True)
        info["input"] = json.loads((directory / INPUT_FILE).read_text())
        info.update(modelprobe.count(directory))
        return PreparedModel(directory, info)
    directory = workdir / "unpacked" / model.name
    shutil.rmtree(directory, ignore_errors=True)
    _stage(fetched, fmt, directory, model.name, None)
    handler, replaced = _adopt_archive(directory)
    info["handler"] = handler
    if replaced:
        info["archiveConfigReplaced"] = replaced
    if handler != models.HANDLER_FILE and precision is not Precision.FP32:
        raise ModelSourceError(
            "PrecisionNotSupported",
            f"{source.describe()}: this archive brings its own handler ({handler}), which servinglab cannot "
            f"switch to {precision}; serve it at fp32, or give the TorchScript/.pt2 model file instead",
        )
    (directory / INFO_FILE).write_text(json.dumps(info, indent=2))
    return PreparedModel(directory, info)


def _ensure(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder
