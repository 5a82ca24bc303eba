"""hack/slow-host.sh (hack/slow_host.py): runs tests under busy loops several times and lists every
test that failed in any run; its loops burn only the share of the time they are given."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import psutil

from support.paths import ROOT
from support.scripts import load_hack_script

HACK = ROOT / "hack"
SCRIPT = HACK / "slow-host.sh"

# Fails on its second run only (a counter file beside it), the way a test fails on a busy host now and then.
FLAKY_TESTS = """
from pathlib import Path

COUNTER = Path(__file__).with_name("runs")


def test_steady():
    assert True


def test_fails_on_the_second_run():
    runs = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(runs))
    assert runs != 2, "the second run"
"""


def slow_host() -> ModuleType:
    return load_hack_script("slow_host")


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=600, check=False)


def test_a_test_that_failed_in_one_run_is_listed_with_that_run_and_each_share_is_run_in_turn(tmp_path: Path) -> None:
    (tmp_path / "test_flaky.py").write_text(FLAKY_TESTS)
    logs = tmp_path / "logs"
    # light loops: this runs beside other timing-sensitive tests
    done = run_tool(
        "--busy", "1", "--duty", "0.1,0.2", "--runs", "2", "--logs", str(logs), "--", "-q", str(tmp_path)
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "1 busy loop(s) at 0.1,0.2 duty" in out, out
    assert re.search(r"^run 1/2: 2 passed in .*\(duty 0\.1, exit 0,", out, re.MULTILINE), out
    assert re.search(r"^run 2/2: 1 failed, 1 passed in .*\(duty 0\.2, exit 1,", out, re.MULTILINE), out
    assert "1 test(s) failed in at least one run:" in out, out
    assert "test_fails_on_the_second_run\n    runs 2 of 2: AssertionError: the second run" in out, out
    assert "test_steady" not in out, out
    assert (logs / "run-1.log").exists() and (logs / "run-2.log").exists()


def test_a_share_outside_0_to_1_not_a_number_or_beyond_the_runs_is_refused_by_name(tmp_path: Path) -> None:
    for wrong, runs, said in (
        ("0", "1", "--duty: each share must be above 0 and at most 1, got 0"),
        ("0.5,1.5", "2", "got 1.5"),
        ("half", "1", "--duty: shares such as 0.3,1, got 'half'"),
        ("0.3,0.6,1", "2", "--runs 2 would leave out some of the 3 --duty shares"),
    ):
        done = run_tool("--duty", wrong, "--runs", runs, "--logs", str(tmp_path), "--", str(tmp_path))
        assert done.returncode == 2, done.stdout
        assert said in done.stderr, done.stderr
        assert not (tmp_path / "run-1.log").exists(), "refused before any run"


def test_a_loop_given_a_fifth_of_the_time_burns_no_more_than_about_that() -> None:
    # An upper bound: on a slower or busier host a loop gets less CPU, never more. Measured from 1.5 s
    # after its start, to leave out most of its interpreter's start-up (CPU the loop did not choose).
    (loop,) = slow_host().start_busy_loops(1, 0.2)
    try:
        process = psutil.Process(loop.pid)
        time.sleep(1.5)
        started, cpu_before = time.monotonic(), sum(process.cpu_times()[:2])
        time.sleep(2.0)
        share = (sum(process.cpu_times()[:2]) - cpu_before) / (time.monotonic() - started)
    finally:
        loop.kill()
        loop.wait()
    assert share < 0.45, f"a loop at 0.2 duty burnt {share:.0%} of a core"


def test_a_loop_ends_by_itself_once_the_tool_that_started_it_is_gone() -> None:
    # The loop's parent here is a Python process that starts it, prints its pid and is killed at once,
    # most often before the loop's interpreter is up (a loop that read its parent then saw init's pid
    # and never ended: this test caught it).
    start = "import slow_host, time; print(slow_host.start_busy_loops(1, 0.5)[0].pid, flush=True); time.sleep(600)"
    starter = subprocess.Popen(
        [sys.executable, "-c", start], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(HACK)}
    )
    assert starter.stdout is not None
    loop = psutil.Process(int(starter.stdout.readline()))
    starter.kill()
    starter.wait()
    try:
        gone, _ = psutil.wait_procs([loop], timeout=60)
        assert gone, "the busy loop outlived the tool"
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            loop.kill()


def test_a_loop_told_of_a_parent_that_is_not_its_own_ends_at_once() -> None:
    # The same rule without a race: a loop whose given parent is not its parent (pid 1 here) is one
    # whose tool is gone.
    loop = subprocess.Popen([sys.executable, "-c", slow_host().BUSY_LOOP, "0.5", "1"])
    try:
        assert loop.wait(timeout=60) == 0
    finally:
        loop.kill()
