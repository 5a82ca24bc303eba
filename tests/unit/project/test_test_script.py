"""hack/test.sh (`make test`, CI) starts its parts in the right order and collects every outcome.

The real script runs in a copy of the repository's layout whose tools are stand-ins: the control-plane
build, the image build, pytest, ruff, lint-imports and mypy are small bash scripts. The stand-ins prove
the order by waiting on each other through marker files, not by timing: the control-plane build only
finishes once the unit + integration session has started (so that session did not wait for it), the
tests/k8s sessions (the real-node tests and the rest, each waiting for the other to start) refuse to run
before the build finished, and the unit + integration session only finishes once tests/k8s has started
(so they all ran side by side).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from support.paths import ROOT

# Waits for a marker file; a generous bound, so that a broken order fails instead of hanging.
WAIT_FOR = 'wait_for() { for _ in $(seq 1200); do [[ -e "$MARKS/$1" ]] && return 0; sleep 0.1; done; return 1; }\n'

STUBS = {
    "hack/images.sh": "exit 0\n",
    # the cluster's part first; the real node's part after it, beside tests/k8s (which does not wait for it)
    "hack/build-control-plane.sh": (
        'echo "building $1" >&2\n'
        "if [[ $1 == node ]]; then\n"
        '  [[ -e "$MARKS/control-plane-done" ]] || { echo "node part before cluster part" >&2; exit 1; }\n'
        '  wait_for k8s-started || { echo "tests/k8s waited for the node part" >&2; exit 1; }\n'
        '  [[ -n "${NODE_FAILS:-}" ]] && exit 1\n'
        '  touch "$MARKS/node-built"; echo /the/binaries; exit 0\n'
        "fi\n"
        '[[ $1 == cluster ]] || { echo "asked for $1, not the cluster part" >&2; exit 1; }\n'
        'wait_for local-started || { echo "the unit + integration session had not started" >&2; exit 1; }\n'
        '[[ -n "${CP_FAILS:-}" ]] && exit 1\n'
        'touch "$MARKS/control-plane-done"; echo /the/binaries\n'
    ),
    ".venv/bin/pytest": (
        'if [[ " $* " == *" tests/k8s/real_node "* ]]; then\n'
        '  [[ -e "$MARKS/control-plane-done" ]] || { echo "FAILED node - started before the control plane"; exit 1; }\n'
        '  touch "$MARKS/node-started"; echo "node args: $*"\n'
        '  wait_for k8s-started || { echo "FAILED node - the rest of tests/k8s did not start beside it"; exit 1; }\n'
        '  [[ ${NODE_TESTS_EXIT:-0} == 1 ]] && echo "FAILED tests/k8s/real_node/test_x.py::test_y - boom"\n'
        '  exit "${NODE_TESTS_EXIT:-0}"\n'
        'elif [[ " $* " == *" tests/k8s "* ]]; then\n'
        '  [[ -e "$MARKS/control-plane-done" ]] || { echo "FAILED k8s - started before the control plane"; exit 1; }\n'
        '  touch "$MARKS/k8s-started"; echo "k8s args: $*"\n'
        '  [[ " $* " == *" --cluster=existing "* ]] && exit 0  # no real-node session on another cluster\n'
        '  wait_for node-started || { echo "FAILED k8s - the real-node tests did not start beside it"; exit 1; }\n'
        "else\n"
        '  touch "$MARKS/local-started"; echo "local args: $*"\n'
        '  [[ -n "${CP_FAILS:-}" ]] && exit 0\n'
        '  wait_for k8s-started || { echo "FAILED local - tests/k8s did not start beside it"; exit 1; }\n'
        "fi\n"
    ),
    ".venv/bin/ruff": "exit 0\n",
    ".venv/bin/lint-imports": "exit 0\n",
    # the checks run beside the tests, not before them; mypy's failure must reach the summary
    ".venv/bin/mypy": 'wait_for local-started || exit 3\necho "mypy: 1 error"; exit 1\n',
}


def run_script(tmp_path: Path, *args: str, **env: str) -> tuple[int, list[str]]:
    repo, marks = tmp_path / "repo", tmp_path / "marks"
    marks.mkdir()
    (repo / "hack").mkdir(parents=True)
    shutil.copy(ROOT / "hack/test.sh", repo / "hack/test.sh")
    for name, body in STUBS.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/usr/bin/env bash\n" + WAIT_FOR + body)
        path.chmod(0o755)
    result = subprocess.run(
        [str(repo / "hack/test.sh"), *(args or ("-k", "tiny"))],
        env={**os.environ, "MARKS": str(marks), "SERVINGLAB_TEST_LOGS": str(tmp_path / "logs"), **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return result.returncode, result.stdout.splitlines()


def events(lines: list[str]) -> list[str]:
    """The script's own progress lines, without their clock and remarks: '[test 10:00:00 +3s] tests/k8s started'."""
    return [line.split("] ", 1)[1].split(";")[0] for line in lines if line.startswith("[test ")]


def test_the_unit_and_cluster_sessions_do_not_wait_for_what_they_do_not_need(tmp_path: Path) -> None:
    status, lines = run_script(tmp_path)
    steps = events(lines)
    order = ["unit + integration started", "control plane ready", "tests/k8s started", "unit + integration done"]
    assert [step for step in steps if step in order] == order, lines
    assert "tests/k8s done" in steps
    assert (tmp_path / "marks/node-built").exists(), lines
    assert not any("did not build" in step for step in steps), lines
    assert "[local] local args: -p no:cacheprovider --durations=15 tests/unit tests/integration -k tiny" in lines
    assert "[k8s] k8s args: -p no:cacheprovider --durations=15 tests/k8s --ignore=tests/k8s/real_node -k tiny" in lines
    assert "[k8s-node] node args: -p no:cacheprovider --durations=15 tests/k8s/real_node -k tiny" in lines
    assert "tests/k8s/real_node done" in steps
    assert "[lint] mypy: 1 error" in lines
    assert status == 1
    assert steps[-1] == "FAILED: mypy", lines


def test_a_failed_control_plane_build_is_reported_and_the_other_parts_still_run(tmp_path: Path) -> None:
    status, lines = run_script(tmp_path, CP_FAILS="1")
    steps = events(lines)
    assert (
        "control-plane build failed (see " + str(tmp_path / "logs/control-plane.log") + "): tests/k8s not run" in steps
    )
    assert not (tmp_path / "marks/k8s-started").exists()
    assert not (tmp_path / "marks/node-started").exists()
    assert not (tmp_path / "marks/node-built").exists()
    assert "unit + integration done" in steps and "lint and type checks done" in steps
    assert status == 1
    assert steps[-1].startswith("FAILED: "), lines
    assert sorted(steps[-1].removeprefix("FAILED: ").split()) == ["control-plane", "k8s", "mypy"]


def test_a_failed_build_of_the_real_nodes_binaries_is_said_and_left_to_the_real_node_tests(tmp_path: Path) -> None:
    status, lines = run_script(tmp_path, NODE_FAILS="1")
    steps = events(lines)
    assert status == 1  # mypy's stand-in fails
    assert "the real node's binaries did not build (see " + str(tmp_path / "logs/node-binaries.log") + ")" in steps
    assert "tests/k8s done" in steps
    assert not (tmp_path / "marks/node-built").exists()
    # reported, not a failure of its own: the real-node tests ask for the same build and fail naming it
    assert steps[-1] == "FAILED: mypy", lines


def test_a_failed_real_node_test_is_listed_with_the_others(tmp_path: Path) -> None:
    status, lines = run_script(tmp_path, NODE_TESTS_EXIT="1")
    steps = events(lines)
    assert status == 1
    assert "[k8s-node] FAILED tests/k8s/real_node/test_x.py::test_y - boom" in lines
    assert sorted(steps[-1].removeprefix("FAILED: ").split()) == ["k8s-node", "mypy"], lines


def test_a_filter_that_selects_no_real_node_test_is_not_a_failure(tmp_path: Path) -> None:
    status, lines = run_script(tmp_path, NODE_TESTS_EXIT="5")  # pytest's "no tests collected"
    assert "[k8s-node] no real-node test selected" in lines
    assert status == 1  # mypy's stand-in fails, and only that
    assert events(lines)[-1] == "FAILED: mypy", lines


def test_on_another_cluster_the_real_node_tests_are_not_started(tmp_path: Path) -> None:
    status, lines = run_script(tmp_path, "--cluster=existing")
    steps = events(lines)
    assert "tests/k8s started" in steps and "tests/k8s done" in steps
    assert not (tmp_path / "marks/node-started").exists()
    assert not any(line.startswith("[k8s-node]") for line in lines)
    assert status == 1  # mypy's stand-in fails, and only that
    assert steps[-1] == "FAILED: mypy", lines
