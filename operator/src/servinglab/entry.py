"""Console entry point: patches the process with gevent first when the command generates load.

Locust monkey-patches sockets, threads and subprocesses with gevent when it is imported; that must
happen before anything else imports `ssl` or `socket`, so commands that run Locust import it here,
ahead of the CLI module and its dependencies.
"""

import sys

_LOAD_COMMANDS = {"run", "loadtest", "sweep"}


def main() -> None:
    if _LOAD_COMMANDS.intersection(sys.argv[1:2]) and "--cluster" not in sys.argv:
        import locust  # noqa: F401  (imported for its gevent monkey-patching side effect)

    from servinglab.cli import main as cli_main

    cli_main()
