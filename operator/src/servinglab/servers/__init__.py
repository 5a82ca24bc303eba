"""The model servers servinglab measures, behind one seam (:mod:`servinglab.servers.base`): TorchServe
(:mod:`.torchserve`), LitServe (:mod:`.litserve`) and Triton (:mod:`.triton`), each one folder whose server
carries what it supports (its entry of :data:`servinglab.api.servers.CAPABILITIES`). What they share is
here too: the handler's settings (:mod:`.handler`), the pod's model init containers (:mod:`.podparts`), a
user's own model (:mod:`.usermodel`), local processes (:mod:`.process`) and counters (:mod:`.counters`).

:func:`get` is the only way in: nothing outside this package imports a server's own folder. :data:`REGISTRY`
names each kind's server; its folder is imported on first use (a server's modules are not light), so a
fourth server is one entry here, its declaration and its folder.
"""

from __future__ import annotations

import importlib

from servinglab.api import ServerKind
from servinglab.servers.base import Server

#: Each server kind's server: (its folder's module, the server object's name there).
REGISTRY: dict[str, tuple[str, str]] = {
    "torchserve": ("servinglab.servers.torchserve", "TORCHSERVE"),
    "litserve": ("servinglab.servers.litserve", "LITSERVE"),
    "triton": ("servinglab.servers.triton", "TRITON"),
}


def get(kind: ServerKind = "torchserve") -> Server:
    """The server of this kind."""
    if kind not in REGISTRY:
        raise ValueError(f"unknown server kind {kind!r} (one of {', '.join(REGISTRY)})")
    module, name = REGISTRY[kind]
    server: Server = getattr(importlib.import_module(module), name)
    return server
