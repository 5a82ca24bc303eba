"""The model servers servinglab measures, behind one seam (:mod:`servinglab.servers.base`): TorchServe
(:mod:`.torchserve`) and LitServe (:mod:`.litserve`), each one folder; what they share is here too (the
handler's settings, the pod's model init containers, local processes).

:func:`get` is the only way in: nothing outside this package imports a server's own folder.
"""

from __future__ import annotations

from servinglab.api import ServerKind
from servinglab.servers.base import Server


def get(kind: ServerKind = "torchserve") -> Server:
    """The server of this kind."""
    if kind == "torchserve":
        from servinglab.servers.torchserve import TORCHSERVE

        return TORCHSERVE
    if kind == "triton":
        from servinglab.servers.triton import TRITON

        return TRITON
    if kind == "litserve":
        from servinglab.servers.litserve import LITSERVE

        return LITSERVE
    raise ValueError(f"unknown server kind {kind!r}")
