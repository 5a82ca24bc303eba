"""The payload folder: the one place the load generator reads the user's files from (bodies, a records
file, the files records name, a trace), and how much of each it reads.

Locally the folder is the current directory; in the load Job it is the mounted ConfigMap or the claim's
folder (`servinglab loadtest --payload-dir`). A name is resolved — symlinks followed, as a mounted
ConfigMap's keys are symlinks into its own folder — and must stay inside the resolved folder, so no
absolute path, '..' or symlink makes the load read, say, the pod's ServiceAccount token and send it to
the server. Only regular files are read, each up to a limit. Used by :mod:`servinglab.loadgen.payloads`
and :mod:`servinglab.loadgen.shapes`, which turn :class:`FolderError` into their own errors.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class FolderError(ValueError):
    """A file outside the payload folder, not a regular file, too large or unreadable; the message names it."""


def confined(folder: Path, name: str, what: str, start: Path | None = None) -> Path:
    """`name` (relative to `start`, default the folder) resolved; FolderError unless it lies inside the
    resolved `folder`. `what` names the field it came from."""
    base = folder.resolve()
    path = ((start or base) / name).resolve()
    if not path.is_relative_to(base):
        raise FolderError(f"{what}: {name!r} leads outside the payload folder {folder}; name a file inside it")
    return path


def within_volume(folder: Path, inside: str, what: str) -> Path:
    """The payload folder `folder`, which is the path `inside` of a mounted volume (a claim's folder),
    resolved; FolderError if a symlink on the way leads it out of the volume."""
    depth = len(Path(inside).parts)
    if depth == 0 or folder.parts[-depth:] != Path(inside).parts:
        return folder.resolve()
    return confined(folder.parents[depth - 1], inside, what)


def read_bounded(path: Path, limit: int, what: str, shown: str | None = None) -> bytes:
    """The bytes of the regular file `path`, refused past `limit` (`shown` names it in errors)."""
    shown = shown or str(path)
    try:
        # no blocking on a FIFO, no following a symlink put in place of the resolved file since
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(descriptor, "rb") as file:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise FolderError(f"{what}: {shown} is not a regular file")
            data = file.read(limit + 1)
    except OSError as exc:
        raise FolderError(f"{what}: cannot read {shown}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise FolderError(f"{what}: {shown} is larger than {_size(limit)}; at most that is read")
    return data


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count} bytes"
