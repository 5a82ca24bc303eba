"""The model servers servinglab measures, behind one seam (:mod:`servinglab.servers.base`): TorchServe
(:mod:`.torchserve`), LitServe (:mod:`.litserve`) and Triton (:mod:`.triton`), each one folder that declares
what it supports (:class:`~servinglab.servers.base.Capabilities`). What they share is here too: the handler's
settings (:mod:`.handler`), the pod's model init containers (:mod:`.podparts`), a user's own model
(:mod:`.usermodel`), local processes (:mod:`.process`) and counters (:mod:`.counters`).

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
