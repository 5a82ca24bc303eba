"""Run chosen tests on a host made slow on purpose, several times, and list every test that failed.

The suite's tests must hold on a host much slower than a developer's (CI's machines are shared and
busy); a test that leans on timing passes here and fails there. This tool starts N busy loops
(processes that only burn CPU, at the tests' own priority), runs pytest R times under them, and
reports each test that failed in any run: its id, which runs, and the first line of its failure.

    hack/slow-host.sh [--busy N] [--duty D[,D...]] [--runs R] [--logs DIR] [-- PYTEST ARGS...]
    hack/slow-host.sh --busy 2 --runs 3 -- tests/integration/test_x.py -k y
    hack/slow-host.sh --busy 2 --duty 0.3,0.6,1 --runs 3 -- tests/integration/test_x.py

A host that is always saturated is not the only hard case: a test can pass when every attempt it makes
is disturbed, and when none is, and fail in between (a few stalls, not enough to be flagged). `--duty`
makes each busy loop burn at most that share of every 100 ms and sleep the rest, at a random phase;
several shares are taken in turn, one per run (the loops are restarted between runs), so --runs must be
at least their number.

Without PYTEST ARGS the whole default selection runs (pyproject's testpaths). Each run's output is
kept in DIR/run-<i>.log (default $SERVINGLAB_TEST_LOGS/slow-host, else test-logs/slow-host). The busy
loops are stopped at the end, also on Ctrl-C or SIGTERM, and each one also ends by itself when this
tool's process is gone. Exit status: 0 when every run passed, 1 when a test failed (or a run ended
without passing and without a failed test, e.g. a collection error), 2 for bad arguments.

The same module is the pytest plugin (`-p slow_host`) that writes each failure of a run to a JSON-lines
file, so that ids and messages are read from pytest's own reports rather than from its terminal output.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

REPO = Path(__file__).resolve().parent.parent
REPORT_ENV = "SLOW_HOST_REPORT"
# A busy loop that checks every period whether its parent (this tool) is still there, so that not even
# a SIGKILL of the tool leaves it burning CPU. The tool's pid is passed, not read from getppid() at
# start: a tool killed before the loop's interpreter is up would leave it reading init's pid and burning
# forever. Given a duty below 1 it burns at most that share of every period (timed by the clock) and
# sleeps the rest, from a random phase so that the loops' bursts do not line up.
BUSY_LOOP = """
import os, random, sys, time
duty, parent, period = float(sys.argv[1]), int(sys.argv[2]), 0.1
time.sleep(random.random() * period)
while os.getppid() == parent:
    until = time.monotonic() + duty * period
    while time.monotonic() < until:
        pass
    if duty < 1:
        time.sleep((1 - duty) * period)
"""


# --- the pytest plugin (runs inside each pytest run) ---------------------------------------------


def _first_line(report: pytest.CollectReport | pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or report.longreprtext
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "(no message)")[:300]


def _record(nodeid: str, when: str, report: pytest.CollectReport | pytest.TestReport) -> None:
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"id": nodeid, "when": when, "first_line": _first_line(report)}) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _record(report.nodeid, report.when or "call", report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _record(report.nodeid or "(collection)", "collect", report)


# --- the tool --------------------------------------------------------------------------------------


@dataclass
class Failure:
    first_line: str
    runs: list[int] = field(default_factory=list)


def start_busy_loops(count: int, duty: float = 1.0) -> list[subprocess.Popen[bytes]]:
    loop = [sys.executable, "-c", BUSY_LOOP, str(duty), str(os.getpid())]
    # a session of their own: Ctrl-C reaches the tool, which stops them, not them with tracebacks
    return [subprocess.Popen(loop, start_new_session=True) for _ in range(count)]


def duties(text: str) -> list[float]:
    """`--duty`'s shares, each in (0, 1]."""
    try:
        shares = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"shares such as 0.3,1, got {text!r}") from None
    wrong = [share for share in shares if not 0 < share <= 1]
    if wrong:
        raise argparse.ArgumentTypeError(f"each share must be above 0 and at most 1, got {wrong[0]:g}")
    return shares


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.kill()
    for process in processes:
        process.wait()


def summary_line(log: Path) -> str:
    """pytest's last line ("3 passed, 1 failed in 12.3s"), without its rule."""
    lines = [line.strip(" =") for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def run_once(index: int, pytest_args: list[str], logs: Path) -> tuple[int, list[dict[str, Any]]]:
    """One pytest run; its exit status and the failures its plugin recorded."""
    report, log = logs / f"run-{index}.jsonl", logs / f"run-{index}.log"
    report.unlink(missing_ok=True)
    env = dict(os.environ, **{REPORT_ENV: str(report)})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "hack"), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-p", "slow_host", "-p", "no:cacheprovider", *pytest_args]
    with log.open("w") as out:
        pytest_run = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            status = pytest_run.wait()
        finally:
            if pytest_run.poll() is None:  # interrupted: let pytest stop its servers, then make sure
                pytest_run.send_signal(signal.SIGINT)
                try:
                    pytest_run.wait(30)
                except subprocess.TimeoutExpired:
                    pytest_run.kill()
    failures = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    return status, failures


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The tool's options (checked) and the arguments after `--` for pytest."""
    parser = argparse.ArgumentParser(
        prog="hack/slow-host.sh", description=__doc__.split("\n\n")[0], usage="%(prog)s [options] [-- PYTEST ARGS...]"
    )
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the tests (default 2)")
    parser.add_argument(
        "--duty", type=duties, default=[1.0], help="share of the time each loop burns, one per run in turn (default 1)"
    )
    parser.add_argument("--runs", type=int, default=3, help="how many times to run the tests (default 3)")
    default_logs = Path(os.environ.get("SERVINGLAB_TEST_LOGS", "test-logs")) / "slow-host"
    parser.add_argument(
        "--logs", type=Path, default=default_logs, help=f"where each run's output goes ({default_logs})"
    )
    own, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(own)
    if args.busy < 0:
        parser.error(f"--busy must be 0 or more, got {args.busy}")
    if args.runs < 1:
        parser.error(f"--runs must be 1 or more, got {args.runs}")
    if args.runs < len(args.duty):
        parser.error(f"--runs {args.runs} would leave out some of the {len(args.duty)} --duty shares")
    return args, pytest_args


def report(failed: dict[str, Failure], broken_runs: list[str], runs: int) -> int:
    """Print what failed in which runs; the tool's exit status."""
    for line in broken_runs:
        print(line)
    if not failed:
        print("no test failed" if not broken_runs else "no test failed, but a run did not pass")
        return 1 if broken_runs else 0
    print(f"{len(failed)} test(s) failed in at least one run:")
    for test_id, entry in sorted(failed.items()):
        print(f"  {test_id}\n    runs {', '.join(map(str, entry.runs))} of {runs}: {entry.first_line}")
    return 1


def main(argv: list[str]) -> int:
    args, pytest_args = parse(argv)
    logs = args.logs
    logs.mkdir(parents=True, exist_ok=True)
    # SIGTERM ends the tool the way Ctrl-C does: through the `finally` that stops the busy loops
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    what = " ".join(pytest_args) or "the default selection"
    shares = " at " + ",".join(f"{share:g}" for share in args.duty) + " duty" if args.duty != [1.0] else ""
    print(
        f"slow host: {args.busy} busy loop(s){shares} on {os.cpu_count()} CPU(s), {args.runs} run(s) of {what}",
        flush=True,
    )
    failed: dict[str, Failure] = {}
    broken_runs: list[str] = []
    busy: list[subprocess.Popen[bytes]] = []
    running_duty: float | None = None
    try:
        for index in range(1, args.runs + 1):
            duty = args.duty[(index - 1) % len(args.duty)]
            if duty != running_duty:
                stop(busy)
                busy, running_duty = start_busy_loops(args.busy, duty), duty
            began = time.monotonic()
            status, failures = run_once(index, pytest_args, logs)
            log = logs / f"run-{index}.log"
            took = time.monotonic() - began
            at = f"duty {duty:g}, " if len(args.duty) > 1 else ""
            print(f"run {index}/{args.runs}: {summary_line(log)} ({at}exit {status}, {took:.0f} s; {log})", flush=True)
            for failure in failures:
                test_id = failure["id"] if failure["when"] == "call" else f"{failure['id']} ({failure['when']})"
                entry = failed.setdefault(test_id, Failure(failure["first_line"]))
                if index not in entry.runs:
                    entry.runs.append(index)
            if status != 0 and not failures:
                broken_runs.append(f"run {index}: pytest exited {status} without a failed test (see {log})")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        stop(busy)
    return report(failed, broken_runs, args.runs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
