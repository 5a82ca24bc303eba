"""Bringing the user's model onto this machine, bounded and checked: the first half of preparing it.

- A URL is downloaded into the caller's private work folder: at most `maxBytes`, counted on the bytes
  written (a Content-Length above it is refused before the body is read). The Authorization header goes
  to the URL's own origin only (urllib would copy it to any host a redirect names), over https only, and
  a redirect from https to anything else is refused. With a cache, a download whose expected sha256 is
  given is kept at `<cache>/files/<sha256>/<name>`; a cached copy is re-hashed on its way into the work
  folder, and one that no longer matches its name is thrown away and fetched again.
- A file already here (a local path, or a claim mounted into the init container) is copied into the work
  folder, hashed and counted on the way; a folder likewise, file by file (no symlink may leave it).

What this returns is the caller's own copy, hashed as it was written: what was checked is what is served,
whatever happens to the cache or the claim afterwards. Called by :func:`servinglab.modelsource.prepare`,
which recognises and lays out what this fetches. Each failure is a :class:`ModelSourceError` with the
reason the experiment ends with and a message naming the source (its query string redacted).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.client import HTTPMessage
from pathlib import Path
from typing import IO

from servinglab.api import ModelSource
from servinglab.api.modelref import MODEL_MAX_BYTES_LIMIT, redact_url
from servinglab.api.reasons import Reason

#: Authorization header value for a URL source (from a Secret, in the fetching init container only).
AUTHORIZATION_ENV = "SERVINGLAB_MODEL_AUTHORIZATION"
#: A URL source's whole URL, query string and all (from a Secret, in the fetching init container only): the
#: spec file in the experiment's ConfigMap has it redacted.
MODEL_URL_ENV = "SERVINGLAB_MODEL_URL"
#: The key of the Secret the operator keeps a model's whole URL in.
MODEL_URL_KEY = "url"
DOWNLOAD_TIMEOUT_SECONDS = 60.0
#: The most files a folder or an archive may hold (each costs an inode on the node, whatever its size).
MAX_FILES = 100_000
_CHUNK = 1 << 20


class ModelSourceError(RuntimeError):
    """The model cannot be served; `reason` is the condition reason the experiment ends with."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Fetched:
    """A source brought into the work folder: a file or folder, its digest (files only) and its size."""

    path: Path
    sha256: str | None
    size_bytes: int
    downloaded: bool = False


def cache_dir() -> Path:
    override = os.environ.get("SERVINGLAB_MODEL_CACHE")
    if override:
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servinglab" / "models"


def too_large(source: ModelSource, what: str) -> ModelSourceError:
    return ModelSourceError(
        Reason.MODEL_TOO_LARGE,
        f"{source.describe()}: {what}, more than maxBytes ({source.max_bytes} bytes); if the model really is "
        f"that large, raise spec.model.source.maxBytes (at most {MODEL_MAX_BYTES_LIMIT})",
    )


def copy_counted(stream: IO[bytes], out: IO[bytes], source: ModelSource, already: int = 0) -> tuple[str, int]:
    """Copy `stream` to `out`; (sha256, bytes). Stops with ModelTooLarge before `already` plus what it has
    written would pass maxBytes: a stream that never ends, or a lying header, costs maxBytes at most."""
    digest, written = hashlib.sha256(), 0
    while chunk := stream.read(_CHUNK):
        written += len(chunk)
        if already + written > source.max_bytes:
            raise too_large(source, f"{already + written} bytes and counting")
        digest.update(chunk)
        out.write(chunk)
    return digest.hexdigest(), written


def _checked(source: ModelSource, digest: str) -> None:
    if source.sha256 is not None and digest != source.sha256:
        raise ModelSourceError(
            Reason.MODEL_CHECKSUM_MISMATCH, f"{source.describe()}: sha256 is {digest}, the spec expects {source.sha256}"
        )


def take_file(source: ModelSource, path: Path, into: Path) -> Fetched:
    """The file at `path` (a local path, a claim, the cache), copied to `into` and checked."""
    try:
        size = path.stat().st_size
    except OSError:
        raise ModelSourceError(Reason.MODEL_DOWNLOAD_FAILED, f"{source.describe()}: no such file or folder") from None
    if size > source.max_bytes:
        raise too_large(source, f"{size} bytes")
    with path.open("rb") as stream, into.open("xb") as out:
        sha256, written = copy_counted(stream, out, source)
    _checked(source, sha256)
    return Fetched(into, sha256, written)


def copy_folder(source: ModelSource, folder: Path, into: Path) -> Fetched:
    """The folder's files copied under `into`, counted against maxBytes and MAX_FILES as they are written.
    A symlink that leaves the folder, or one to a folder, is refused (it would read what is not the model:
    another experiment's cached model, the process's environment); sockets and pipes are skipped."""
    root, written, files = folder.resolve(), 0, 0
    into.mkdir(parents=True)
    for current, folders, names in os.walk(folder):
        here = Path(current)
        relative = here.relative_to(folder)
        for name in folders:
            if (here / name).is_symlink():
                raise ModelSourceError(Reason.MODEL_NOT_RECOGNIZED, f"{source.describe()}: {relative / name} is a link")
            (into / relative / name).mkdir()
        for name in names:
            path = here / name
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                raise ModelSourceError(
                    Reason.MODEL_NOT_RECOGNIZED,
                    f"{source.describe()}: {relative / name} is a symlink out of the folder",
                )
            if not path.is_file():
                continue
            files += 1
            if files > MAX_FILES:
                raise too_large(source, f"more than {MAX_FILES} files")
            with path.open("rb") as stream, (into / relative / name).open("xb") as out:
                written += copy_counted(stream, out, source, written)[1]
    return Fetched(into, None, written)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        port = -1
    return parts.scheme, (parts.hostname or "").lower(), port


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, with the credentials kept to their origin: the Authorization header is an
    unredirected header, put back on a redirected request only when it goes to the origin (scheme, host,
    port) it was given for. A redirect from https to anything else is refused: the download would lose
    its integrity, and the header its confidentiality."""

    def __init__(self, url: str, authorization: str | None) -> None:
        super().__init__()
        self.url, self.origin, self.authorization = url, _origin(url), authorization

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: HTTPMessage, newurl: str
    ) -> urllib.request.Request | None:
        scheme, current = urllib.parse.urlsplit(newurl).scheme, urllib.parse.urlsplit(req.full_url).scheme
        if scheme not in ("http", "https") or (current == "https" and scheme != "https"):
            raise ModelSourceError(
                Reason.MODEL_DOWNLOAD_FAILED,
                f"{redact_url(self.url)}: redirected from {redact_url(req.full_url)} to {redact_url(newurl)}; "
                "refused: a download that started on https stays on https",
            )
        redirected = super().redirect_request(req, fp, code, msg, headers, newurl)
        if redirected is not None and self.authorization and _origin(newurl) == self.origin:
            redirected.add_unredirected_header("Authorization", self.authorization)
        return redirected


def file_name(url: str) -> str:
    """The name a URL's file is kept under: its last path segment, reduced to safe characters."""
    name = url.split("?", 1)[0].split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return name if name.strip(".") else "model"


def download(
    source: ModelSource, scratch: Path, cache: Path | None = None, authorization: str | None = None
) -> Fetched:
    """The URL's file in `scratch` (a private folder), from the cache when its expected digest is kept
    there and still matches, else downloaded (and kept in the cache, if there is one and a digest is given)."""
    assert source.url is not None
    url, shown, name = source.url, source.describe(), file_name(source.url)
    into = scratch / name
    kept = cache / "files" / source.sha256 / name if cache is not None and source.sha256 is not None else None
    if kept is not None and kept.is_file():
        try:
            return take_file(source, kept, into)
        except ModelSourceError as exc:
            into.unlink(missing_ok=True)
            if exc.reason != "ModelChecksumMismatch":
                raise
            with contextlib.suppress(OSError):  # changed since it was kept: never served, fetched again
                kept.unlink()
    if authorization and not url.startswith("https://"):
        raise ModelSourceError(Reason.MODEL_DOWNLOAD_FAILED, f"{shown}: credentials are sent over https only")
    request = urllib.request.Request(url, headers={"User-Agent": "servinglab"})
    if authorization:
        request.add_unredirected_header("Authorization", authorization)
    opener = urllib.request.build_opener(_Redirects(url, authorization))
    try:
        with opener.open(request, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response, into.open("xb") as out:
            announced = str(response.headers.get("Content-Length") or "")
            if announced.isdigit() and int(announced) > source.max_bytes:
                raise too_large(source, f"the server announces {announced} bytes (Content-Length)")
            sha256, written = copy_counted(response, out, source)
    except urllib.error.HTTPError as exc:
        into.unlink(missing_ok=True)
        raise ModelSourceError(Reason.MODEL_DOWNLOAD_FAILED, f"{shown}: HTTP {exc.code} {exc.reason}") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        into.unlink(missing_ok=True)
        raise ModelSourceError(Reason.MODEL_DOWNLOAD_FAILED, f"{shown}: {str(exc).replace(url, shown)}") from None
    except ModelSourceError:
        into.unlink(missing_ok=True)
        raise
    try:
        _checked(source, sha256)
    except ModelSourceError:
        into.unlink(missing_ok=True)
        raise
    if kept is not None:
        _keep(into, kept)
    return Fetched(into, sha256, written, downloaded=True)


def _keep(path: Path, kept: Path) -> None:
    """A copy of `path` at `kept`, whole or not at all. The cache only spares downloads: a full or
    read-only cache costs a download next time, never this experiment."""
    partial: Path | None = None
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=kept.parent, prefix=".download-", delete=False) as handle:
            partial = Path(handle.name)
        shutil.copyfile(path, partial)
        os.replace(partial, kept)
    except OSError:
        if partial is not None:
            partial.unlink(missing_ok=True)
