#!/usr/bin/env bash
# The one GPU check (`make gpu-check`): benchmarks/gpu_check.py's steps, one JSON and one Markdown table in
# $OUT (default gpu-check/), for docs/benchmarks.md.
#   - on a GPU machine set up by hack/device-setup.sh (torch from the machine, the rest carried in .device or,
#     for Triton, .device-triton: hack/device-bundle.sh), or with a .venv whose torch sees a GPU;
#   - DRY_RUN=1: the same steps on this CPU with the tiny model (CI runs it: tests/integration/test_gpu_check.py).
# Extra arguments go to the script (e.g. --skip gpu-tests, --servers torchserve).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check}
if [ "${DRY_RUN:-0}" = 1 ]; then
  exec .venv/bin/python benchmarks/gpu_check.py --dry-run --out "$out" "$@"
fi
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  python=.venv/bin/python
else
  # shellcheck source=hack/device-setup.sh
  source hack/device-setup.sh
  python=python3
fi
exec "$python" benchmarks/gpu_check.py --out "$out" "$@"
