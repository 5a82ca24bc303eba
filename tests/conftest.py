"""Shared fixtures: paths of the examples, a tiny model archive built once per session, the images, the
Triton environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servinglab.servers.triton import env as triton_environment
from servinglab.servers.triton.env import TritonEnv

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cluster",
        choices=("local", "kind", "existing"),
        default="local",
        help="Kubernetes for tests/k8s: 'local' builds (or reuses) and starts a real control plane with "
        "KWOK on loopback; 'kind' creates a throw-away kind cluster (needs kind and Docker); 'existing' "
        "uses the current KUBECONFIG cluster. KWOK-simulated GPU nodes are added to all of them.",
    )


#: How much of each failure's message the WHY lines carry: CI shows only the end of its output.
WHY_CHARACTERS = 3000


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each distinct failure once, as `WHY <test> (+N more): <its message, folded onto one line>`: pytest's
    own summary cuts a message to its first line and the terminal's width, and the tail of a CI log
    (hack/test.sh repeats these lines last) is all some readers get. Tests failing alike (one fixture's
    error) share a line."""
    alike: dict[str, list[str]] = {}
    for report in [*terminalreporter.stats.get("failed", []), *terminalreporter.stats.get("error", [])]:
        message = str(getattr(getattr(report.longrepr, "reprcrash", None), "message", "") or report.longrepr)
        alike.setdefault(message, []).append(report.nodeid)
    for message, tests in alike.items():
        folded = " // ".join(line.strip() for line in message.strip().splitlines() if line.strip())
        named = ", ".join(test.rsplit("::", 1)[-1][:60] for test in tests[1:4])
        more = f" (+{len(tests) - 1} more: {named}{', ...' if len(tests) > 4 else ''})" if tests[1:] else ""
        terminalreporter.write_line(f"WHY {tests[0]}{more}: {(folded or '(no message)')[:WHY_CHARACTERS]}")


@pytest.fixture(scope="session")
def servinglab_cmd() -> list[str]:
    """How tests invoke the real command line (the console script of this environment)."""
    script = Path(sys.executable).with_name("servinglab")
    return [str(script)] if script.exists() else [sys.executable, "-m", "servinglab"]


@pytest.fixture(scope="session")
def tiny_archive(tmp_path_factory: pytest.TempPathFactory, servinglab_cmd: list[str]) -> Path:
    """The tiny model as TorchServe serves it (a no-archive directory), built by `servinglab build-model`
    into a temp dir and laid out for TorchServe, as a server pod's init container does."""
    build_dir = tmp_path_factory.mktemp("build")
    archive = tmp_path_factory.mktemp("served") / "tiny"
    command = [*servinglab_cmd, "build-model", "tiny", "--build-dir", str(build_dir), "--into", str(archive)]
    subprocess.run(command, check=True)
    assert (archive / "MAR-INF" / "MANIFEST.json").exists()
    return archive


@pytest.fixture()
def tiny_model_copy(tiny_archive: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny archive a test may modify."""
    target = tmp_path / "tiny"
    shutil.copytree(tiny_archive, target)
    return target


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """The images, built by `hack/images.sh` (what `make images` runs) with the stand-ins this machine
    needs: a Debian base made with debootstrap, the TorchServe stand-in, the pod sandbox image.
    {"operator" | "servinglab" | "torchserve" | "pause": the image's full name}; unchanged images are
    not rebuilt. torch comes from PyPI unless TORCH_INDEX_URL says otherwise (PyTorch's CPU index is
    not reachable everywhere the suite runs)."""
    if shutil.which("podman") is None and shutil.which("docker") is None:
        pytest.fail("the image tests need podman (or docker): apt-get install podman runc debootstrap")
    index = os.environ.get("TORCH_INDEX_URL", "https://pypi.org/simple")
    env = {**os.environ, "STANDIN": "1", "TORCH_INDEX_URL": index}
    built = subprocess.run(
        [ROOT / "hack/images.sh"], env=env, capture_output=True, text=True, timeout=2400, check=False
    )
    assert built.returncode == 0, f"hack/images.sh failed:\n{built.stderr[-6000:]}"
    return {name.rsplit("/", 1)[1].split(":")[0]: name for name in built.stdout.split()}


@pytest.fixture(scope="session")
def triton_env() -> TritonEnv:
    """The Triton environment (made once when missing: `make triton-env` does it before the tests)."""
    return triton_environment.ensure()
