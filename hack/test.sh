#!/usr/bin/env bash
# Everything CI runs (`make test`, the README's test command): lint, types, every test. The parts that
# do not need each other start together, so a cold run costs about the control-plane build plus the
# cluster tests, not the sum of everything:
#   - the images (`hack/images.sh`, for the real-node tests) build in the background from the start;
#   - the control plane is built or reused (cached by version) from the start;
#   - unit + integration (real TorchServe processes) start at once: they need no control plane;
#   - lint and type checks run one after another beside them;
#   - tests/k8s starts as soon as the cluster's part of that build is done, in two sessions side by side,
#     each with its own control plane: the real-node tests (tests/k8s/real_node) and the rest. The real
#     node's binaries build behind them; the real-node session waits for those and for the images.
# Each part's output is prefixed ([local] / [k8s] / [k8s-node] / [lint] / [control-plane]) and kept whole
# under $SERVINGLAB_TEST_LOGS (default test-logs/); the background builds' (images, the real node's
# binaries) are only there. Every part runs to its end; the exit status is non-zero when any part failed.
#
#   hack/test.sh [PYTEST ARGS...]     extra arguments go to every pytest session (a filter that leaves the
#                                     real-node session nothing to run is not a failure)
set -uo pipefail
# `wait -n -p` (bash 5.1+) collects the parts in the order they end
((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 501)) || { echo "hack/test.sh needs bash 5.1 or later" >&2; exit 2; }
cd "$(dirname "$0")/.."
BIN=.venv/bin
logs=${SERVINGLAB_TEST_LOGS:-test-logs}
mkdir -p "$logs"
# a part that does not run this time (tests/k8s after a failed control-plane build) leaves no old log behind
rm -f "$logs"/{local,k8s,k8s-node,lint,control-plane}.log "$logs"/node-binaries.{out,log}
started=$SECONDS
say() { printf '[test %s +%ds] %s\n' "$(date +%T)" "$((SECONDS - started))" "$*"; }

children=()
cleanup() { for pid in "${children[@]}"; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM

background() { # NAME COMMAND...: run COMMAND in the background, its output prefixed [NAME] and kept in
  # $logs/NAME.log; the job's status is COMMAND's. Its own process group (set -m), so cleanup ends all of it.
  local name=$1
  shift
  set -m
  ( "$@" 2>&1 | tee "$logs/$name.log" | sed -u "s/^/[$name] /"
    exit "${PIPESTATUS[0]}" ) &
  set +m
  children+=("$!")
}

quietly() { # OUT LOG COMMAND...: run COMMAND in the background, its output only in files (stdout to
  # $logs/OUT, stderr to $logs/LOG); its own process group, as for `background`
  local out=$1 log=$2
  shift 2
  set -m
  "$@" >"$logs/$out" 2>"$logs/$log" &
  set +m
  children+=("$!")
}

# the same images the suite's `images` fixture asks for (tests/conftest.py)
export STANDIN=1 TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://pypi.org/simple}
quietly images.out images.log hack/images.sh
images=$!
say "images building in the background (log: $logs/images.log)"
# free space, at the start and in a failure's summary: a real node's pod whose image cannot be unpacked
# waits in ContainerCreating until a timeout
free_disk() { df -h --output=avail,target / "${TMPDIR:-/tmp}" "$HOME" 2>/dev/null | tail -n +2 | sort -u | tr -s ' ' | paste -sd ';'; }
say "free disk:$(free_disk)"

# Cold, the control-plane build is the longest part before any cluster test (about 18 minutes on CI's
# machines); warm, it returns in well under a second. Only tests/k8s waits for it, and only for the
# cluster's part: the real node's binaries (kubelet, kube-proxy, CoreDNS; several minutes cold) build
# behind it while the cluster tests run, and the real-node session waits for them.
background control-plane hack/build-control-plane.sh cluster
control_plane=$!
node_binaries=

pytest_session() { "$BIN/pytest" -p no:cacheprovider --durations=15 "$@"; }
real_node_session() { # pytest's 5 (no test selected) is a pass here: `-k chart` selects no real-node test
  pytest_session tests/k8s/real_node "$@"
  local status=$?
  ((status == 5)) && { echo "no real-node test selected"; status=0; }
  return "$status"
}
# The real-node tests start their own node against the local control plane; on another cluster
# (--cluster=existing, kind) they skip, and a second session would only start a second KWOK there.
on_local_cluster() {
  local previous=
  for arg in "$@"; do
    [[ $arg == --cluster=* && $arg != --cluster=local ]] && return 1
    [[ $previous == --cluster && $arg != local ]] && return 1
    previous=$arg
  done
  return 0
}
background local pytest_session tests/unit tests/integration "$@"
local_tests=$!
say "unit + integration started; control plane building or reused"

# The checks run one after another (they are CPU-bound, and so are the tests beside them); a background
# job cannot add to `failed`, so each failed check's name goes to a file read at the end.
lint_failed="$logs/lint.failed"
: >"$lint_failed"
check() { # NAME COMMAND...
  local name=$1
  shift
  say "$name"
  "$@" || echo "$name" >>"$lint_failed"
}
checks() {
  check ruff "$BIN/ruff" check .
  check ruff-format "$BIN/ruff" format --check .
  check import-contracts "$BIN/lint-imports" --no-cache
  check mypy "$BIN/mypy"
}
background lint checks
lint=$!

# Collect the parts in the order they end (not the order they started): each "done" line is on time, and
# tests/k8s starts the moment the control plane is there.
failed=()
k8s_tests=
node_tests=
pending=("$control_plane" "$local_tests" "$lint" "$images")
while ((${#pending[@]})); do
  ended=
  wait -n -p ended "${pending[@]}"
  status=$?
  [[ -n $ended ]] || { failed+=(lost-a-part); say "wait returned no part ($status)"; break; }
  still=()
  for pid in "${pending[@]}"; do [[ $pid == "$ended" ]] || still+=("$pid"); done
  pending=("${still[@]}")
  case $ended in
    "$control_plane")
      if ((status == 0)); then
        say "control plane ready"
        # The real node's tests mostly wait (for the images, the node's start, its pods) while the rest
        # mostly compute, so they run beside each other; one real node at a time (their own session).
        background k8s pytest_session tests/k8s --ignore=tests/k8s/real_node "$@"
        k8s_tests=$!
        if on_local_cluster "$@"; then
          background k8s-node real_node_session "$@"
          node_tests=$!
          pending+=("$node_tests")
          say "tests/k8s started; the real-node tests in a session of their own"
        else
          say "tests/k8s started; the real-node tests not run (they need the local control plane)"
        fi
        # (not niced: under a full load a niced build can starve until the real-node tests wait for it)
        quietly node-binaries.out node-binaries.log hack/build-control-plane.sh node
        node_binaries=$!
        pending+=("$k8s_tests" "$node_binaries")
        say "the real node's binaries building or reused (log: $logs/node-binaries.log)"
      else
        # the cluster fixture would only try the same build again
        failed+=(control-plane k8s)
        say "control-plane build failed (see $logs/control-plane.log): tests/k8s not run"
      fi
      ;;
    "$local_tests")
      ((status == 0)) || failed+=("unit+integration")
      say "unit + integration done"
      ;;
    "$lint")
      mapfile -t -O "${#failed[@]}" failed <"$lint_failed"
      say "lint and type checks done"
      ;;
    "$k8s_tests")
      ((status == 0)) || failed+=(k8s)
      say "tests/k8s done"
      ;;
    "$node_tests")
      ((status == 0)) || failed+=(k8s-node)
      say "tests/k8s/real_node done"
      ;;
    "$node_binaries")
      # as for the images: the real-node tests ask for the same build, and fail naming it if it fails
      ((status == 0)) || say "the real node's binaries did not build (see $logs/node-binaries.log)"
      ;;
    "$images")
      # a failed background build is not a failure of its own: the real-node tests build the images
      # themselves when they are not there, and fail if they cannot
      ((status == 0)) || say "the background image build failed (see $logs/images.log); the tests built them"
      ;;
  esac
  # a part's process ID is never matched twice (a later part may be given a recycled one)
  for part in control_plane local_tests lint k8s_tests node_tests node_binaries images; do
    [[ ${!part} == "$ended" ]] && printf -v "$part" '%s' "done-$ended"
  done
done

if ((${#failed[@]})); then
  # what failed, from every session, last: CI shows the end of this output. First every failed test, then
  # each distinct reason once, its message folded onto one line (tests/conftest.py writes the WHY lines).
  for name in local k8s k8s-node; do
    grep -E '^(FAILED|ERROR) ' "$logs/$name.log" 2>/dev/null | cut -c1-200 | sed "s/^/[$name] /"
  done
  for name in local k8s k8s-node; do
    grep -E '^WHY ' "$logs/$name.log" 2>/dev/null | cut -c1-3200 | sed "s/^/[$name] /"
  done
  say "free disk now:$(free_disk)"
  say "FAILED: ${failed[*]}"
  exit 1
fi
say "all passed"
