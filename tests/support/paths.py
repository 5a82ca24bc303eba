"""Where the repository's files are, for tests at any depth of tests/ (no counting of parent folders)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: Documents written by earlier releases, read back by today's code.
FIXTURES = ROOT / "tests" / "fixtures"
