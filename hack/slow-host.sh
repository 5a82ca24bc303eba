#!/usr/bin/env bash
# Tests under busy loops, several runs, every failure listed: hack/slow_host.py with the project's Python.
#   hack/slow-host.sh --busy 2 --runs 3 -- tests/integration/test_x.py -k y
here=$(dirname "$0")
exec "$here/../.venv/bin/python" "$here/slow_host.py" "$@"
