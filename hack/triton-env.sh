#!/usr/bin/env bash
# Make (or find) the Triton environment: tritonserver 2.51 and its Python backend from the PyTriton wheel,
# numpy 1 for the backend's stub and perf_analyzer, installed with --no-deps from the exact pins of
# operator/src/servinglab/servers/triton/requirements.txt into ~/.cache/servinglab/triton/<key>/ (reused
# while that file, the Python version and the interpreter are unchanged). The project's .venv is not
# touched: its numpy 2 stays. perf_analyzer (benchmarks/triton_perf_analyzer.py only) also needs Debian's
# libb64-0d.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
exec "$python" -c 'from servinglab.servers.triton import env; env.main()'
