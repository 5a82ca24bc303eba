"""The `servinglab` command: each command parses its arguments, calls one function, prints, and exits with
a named code (:class:`~servinglab.api.exitcodes.ExitCode`).

The work is elsewhere: the local wing (:mod:`servinglab.local`), the Kubernetes wing
(:mod:`servinglab.k8s`), the model store (:mod:`servinglab.models`), what people read
(:mod:`servinglab.present`). Commands that generate load are entered through :mod:`servinglab.entry`,
which imports Locust (gevent patching) before this module.
"""

from servinglab.cli import pods, user  # noqa: F401  (each registers its commands on the group)
from servinglab.cli.common import main

__all__ = ["main"]
