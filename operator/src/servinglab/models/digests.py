"""sha256 digests of files and folders, and a folder's manifest of them: what lets a cached folder be reused.

The model cache may be shared by every server pod of a namespace (the chart's modelCache claim), so
nothing in it is trusted because it exists. A folder servinglab made there (a built-in model's build) gets
a manifest, written last, once every file is in place: each file's path and sha256. A reuse re-hashes the
folder and compares it with the manifest, file set included (an extra .py beside a handler is imported
too), and with the digests the caller knows on its own (servinglab's handler files, from this install):
a folder that differs is rebuilt, a copy that differs is refused. Files named by their digest (downloads)
need no manifest: they are re-hashed against their name.

Whoever can write the cache could rewrite a manifest to match what they put there, so on Kubernetes the
manifest is keyed: an HMAC over it with a key that only the model init container is given (from the
operator's key Secret, :data:`KEY_ENV`); a manifest without the right HMAC is no manifest (the build is
made again). Without a key (a local cache, in the user's own folders) the HMAC is neither written nor read.

Called by :mod:`servinglab.models.builtins` (built-in builds) and :mod:`servinglab.models.fetch` (downloads).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

_CHUNK = 1 << 20
#: The key that signs and checks manifests on a shared cache (text; from a Secret, in the model init
#: container only).
KEY_ENV = "SERVINGLAB_MODEL_CACHE_KEY"
_MAC = "hmac"


def env_key() -> bytes | None:
    """The manifest key this process was given (:data:`KEY_ENV`), or None."""
    text = os.environ.get(KEY_ENV, "")
    return text.encode() if text else None


def _mac(key: bytes, document: Mapping[str, object]) -> str:
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def folder_digests(folder: Path) -> dict[str, str]:
    """{relative POSIX path: sha256} of every file under `folder`; a symlink is never followed (it is
    listed as `symlink:<target>`, so that it can never match a manifest written by servinglab)."""
    found: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[relative] = f"symlink:{os.readlink(path)}"
        elif path.is_file():
            found[relative] = file_sha256(path)
    return found


def write_manifest(folder: Path, manifest: Path, key: bytes | None = None, **about: str) -> None:
    """Record every file of `folder` in `manifest` (replaced atomically: call it once the folder is complete),
    with `about` (e.g. the inputs' digest), signed with `key` when there is one."""
    document: dict[str, object] = {"files": folder_digests(folder), **about}
    if key is not None:
        document[_MAC] = _mac(key, document)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=manifest.parent, prefix=".manifest-", delete=False) as partial:
        json.dump(document, partial, indent=1, sort_keys=True)
    os.replace(partial.name, manifest)


def read_manifest(
    manifest: Path, key: bytes | None = None, about: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """The files a manifest lists, or None if it is missing or not one: with a `key`, one whose HMAC is not
    that key's (whoever wrote it does not hold the key); with `about`, one that does not say those values."""
    try:
        document = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    files = document.get("files") if isinstance(document, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return None
    if key is not None:
        signed = {name: value for name, value in document.items() if name != _MAC}
        if not isinstance(document.get(_MAC), str) or not hmac.compare_digest(document[_MAC], _mac(key, signed)):
            return None
    if any(document.get(name) != value for name, value in (about or {}).items()):
        return None
    return {str(k): v for k, v in files.items()}


def difference(folder: Path, listed: Mapping[str, str], known: Mapping[str, str] | None = None) -> str | None:
    """None when `folder` holds exactly the files `listed` names with those digests, and the files whose
    digest the caller `known`s on its own have it; else the first difference, for a message."""
    for name, digest in (known or {}).items():
        if listed.get(name) != digest:
            return f"{name} is not the file this servinglab ships"
    actual = folder_digests(folder)
    for name in sorted(actual.keys() | listed.keys()):
        if name not in actual:
            return f"{name} is missing"
        if name not in listed:
            return f"{name} is not in the manifest"
        if actual[name] != listed[name]:
            return f"{name} has sha256 {actual[name]}, the manifest says {listed[name]}"
    return None
