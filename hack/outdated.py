"""List the pinned dependencies that have a newer release on PyPI (`make outdated`).

Reads the exact pins (`name==version`) of pyproject.toml's [project.dependencies] and every
dependency group, and of the Triton environment's requirements file, asks the index once per
distribution name (`pip index versions`, through pip's own index configuration: no other host is
needed), and prints name, pinned, latest and where each pin is. It changes no pin: moving one is a
decision of its own (the numbers of earlier runs were taken with these).

    .venv/bin/python hack/outdated.py [--timeout SECONDS] [--jobs N]

Exit status 0 whatever is outdated; 1 when a name could not be looked up (no answer in time, or an
answer pip could not read), so that a broken lookup is not mistaken for "all current".
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parent.parent
TRITON_REQUIREMENTS = REPO / "operator/src/servinglab/servers/triton/requirements.txt"
PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)")
LATEST = re.compile(r"^\S+ \(([^)]+)\)")  # pip index versions' first line: "name (latest)"
#: Pins kept behind on purpose, by (canonical name, where pinned), with why: listed as held, not as outdated.
HELD = {
    ("tritonclient", "triton-env"): "perf_analyzer must be the release of the tritonserver that PyTriton 0.7.0 "
    "ships (2.51.0)",
    ("numpy", "triton-env"): "the Python backend's stub is compiled against numpy 1",
}


@dataclass
class Pin:
    name: str
    version: str
    where: list[str] = field(default_factory=list)


def pins() -> dict[str, Pin]:
    """Every exact pin, keyed by canonical name; a name pinned in several places is listed once."""
    found: dict[str, Pin] = {}

    def add(spec: str, where: str) -> None:
        match = PIN.match(spec)
        if match is None:  # not an exact pin (or an include-group): nothing to compare
            return
        name, version = match.groups()
        pin = found.setdefault(canonicalize_name(name), Pin(name, version))
        if pin.version != version:  # the same name pinned differently in two places: show both
            pin.version = f"{pin.version} / {version}"
        pin.where.append(where)

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    for spec in pyproject["project"]["dependencies"]:
        add(spec, "project")
    for group, specs in pyproject.get("dependency-groups", {}).items():
        for spec in specs:
            if isinstance(spec, str):
                add(spec, group)
    for line in TRITON_REQUIREMENTS.read_text().splitlines():
        add(line, "triton-env")
    return found


def latest(name: str, timeout: float) -> str:
    """The newest release on the index that installs here (this Python, this platform; pre-releases left
    out, as pip does), or raise RuntimeError."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", name, "--disable-pip-version-check"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"no answer in {timeout:.0f} s") from None
    match = LATEST.match(result.stdout)
    if result.returncode != 0 or match is None:
        why = (result.stderr.strip().splitlines() or [f"pip exited {result.returncode}"])[-1]
        raise RuntimeError(why)
    return match.group(1)


def newer(pinned: str, newest: str) -> bool:
    """Whether any of a name's pins ("2.4.6 / 1.26.4" when pinned differently in two places) is behind."""
    try:
        return any(Version(newest) > Version(v.strip()) for v in pinned.split("/"))
    except InvalidVersion:
        return newest not in pinned


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per lookup (default 30)")
    parser.add_argument("--jobs", type=int, default=8, help="lookups at once (default 8)")
    args = parser.parse_args()
    if args.timeout <= 0 or args.jobs < 1:
        parser.error(f"--timeout must be > 0 and --jobs >= 1 (got {args.timeout}, {args.jobs})")

    wanted = pins()

    def look_up(pin: Pin) -> tuple[Pin, str | None, str | None]:
        try:
            return pin, latest(pin.name, args.timeout), None
        except RuntimeError as error:
            return pin, None, str(error)

    # one request per name, a few at a time: the whole list takes about one lookup's time per `jobs` names
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        answers = list(pool.map(look_up, sorted(wanted.values(), key=lambda p: p.name.lower())))

    rows = [(p.name, p.version, new, ", ".join(p.where)) for p, new, _ in answers if new and newer(p.version, new)]
    failures = [(p.name, why) for p, _, why in answers if why is not None]
    held = [f"{row[0]} in {where}: {why}" for row in rows for where in row[3].split(", ")
            if (why := HELD.get((canonicalize_name(row[0]), where)))]  # fmt: skip
    print(f"{len(wanted)} pinned names looked up; {len(rows)} have a newer release ({len(held)} held on purpose)")
    if rows:
        widths = [max(len(r[i]) for r in [("name", "pinned", "latest", "pinned in"), *rows]) for i in range(3)]
        for row in [("name", "pinned", "latest", "pinned in"), *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)), row[3])
    for line in held:
        print(f"held: {line}")
    for name, why in failures:
        print(f"{name}: could not look up: {why}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
