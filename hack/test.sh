#!/usr/bin/env bash
# Everything CI runs (`make test`, the README's test command): lint, types, every test. The slow parts
# that only wait on each other run side by side:
#   - the images (`hack/images.sh`, for the real-node tests) build in the background from the start;
#   - the control plane is built or reused (cached by version) while they do;
#   - lint and type checks;
#   - then two pytest sessions at once: unit + integration (real TorchServe processes) and tests/k8s
#     (its own control plane; the real-node tests wait for the images if they are still building).
# Each session's output is prefixed ([local] / [k8s]) and kept whole under $SERVINGLAB_TEST_LOGS
# (default test-logs/). The exit status is non-zero when any part failed; every part runs to its end.
#
#   hack/test.sh [PYTEST ARGS...]     extra arguments go to both pytest sessions
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
logs=${SERVINGLAB_TEST_LOGS:-test-logs}
mkdir -p "$logs"
started=$SECONDS
say() { printf '[test %s +%ds] %s\n' "$(date +%T)" "$((SECONDS - started))" "$*"; }

children=()
cleanup() { for pid in "${children[@]}"; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# the same images the suite's `images` fixture asks for (tests/conftest.py)
export STANDIN=1 TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://pypi.org/simple}
set -m  # each background part in its own process group, so that cleanup ends all of it
hack/images.sh >"$logs/images.out" 2>"$logs/images.log" &
images=$!
children+=("$images")
set +m
say "images building in the background (log: $logs/images.log)"
# free space, at the start and in a failure's summary: a real node's pod whose image cannot be unpacked
# waits in ContainerCreating until a timeout
free_disk() { df -h --output=avail,target / "${TMPDIR:-/tmp}" "$HOME" 2>/dev/null | tail -n +2 | sort -u | tr -s ' ' | paste -sd ';'; }
say "free disk:$(free_disk)"

failed=()
step() { # NAME COMMAND...: run in the foreground, note a failure, go on
  local name=$1
  shift
  say "$name"
  "$@" || failed+=("$name")
}
step control-plane hack/build-control-plane.sh
step ruff "$BIN/ruff" check .
step ruff-format "$BIN/ruff" format --check .
step import-contracts "$BIN/lint-imports" --no-cache
step mypy "$BIN/mypy"

session() { # NAME PYTEST ARGS...: a pytest session in the background, output prefixed and logged
  local name=$1
  shift
  ( "$BIN/pytest" -p no:cacheprovider --durations=15 "$@" 2>&1 | tee "$logs/$name.log" | sed -u "s/^/[$name] /"
    exit "${PIPESTATUS[0]}" ) &
}
set -m
session local tests/unit tests/integration "$@"
local_tests=$!
session k8s tests/k8s "$@"
k8s_tests=$!
set +m
children+=("$local_tests" "$k8s_tests")
say "unit + integration and tests/k8s running side by side"
wait "$local_tests" || failed+=("unit+integration")
say "unit + integration done"
wait "$k8s_tests" || failed+=("k8s")
say "tests/k8s done"
# a failed background build is not a failure of its own: the real-node tests build the images themselves
# when they are not there, and fail if they cannot
wait "$images" || say "the background image build failed (see $logs/images.log); the tests built them"

if ((${#failed[@]})); then
  # what failed, from both sessions, last: CI shows the end of this output. First every failed test, then
  # each distinct reason once, its message folded onto one line (tests/conftest.py writes the WHY lines).
  for name in local k8s; do
    grep -E '^(FAILED|ERROR) ' "$logs/$name.log" 2>/dev/null | cut -c1-200 | sed "s/^/[$name] /"
  done
  for name in local k8s; do
    grep -E '^WHY ' "$logs/$name.log" 2>/dev/null | cut -c1-3200 | sed "s/^/[$name] /"
  done
  say "free disk now:$(free_disk)"
  say "FAILED: ${failed[*]}"
  exit 1
fi
say "all passed"
