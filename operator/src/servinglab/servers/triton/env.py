"""The Triton environment: the `tritonserver` binary, its Python backend and the packages the backend's stub
needs, in a folder of their own (never in the project's .venv, whose pins stay as they are).

Why a folder of its own: the PyTriton wheel that ships `tritonserver` pins numpy<2, and its Python backend's
stub really needs numpy 1 (pybind11 reads numpy 1's array descriptors: under numpy 2 every output tensor is
refused). servinglab runs on numpy 2. So the wheels of `requirements.txt` are installed with `--no-deps`
(only the binaries of PyTriton are used, not its Python API) into `~/.cache/servinglab/triton/<key>/site`,
where `<key>` hashes that file and the Python version; a finished install is marked `.complete` and reused.
The stub runs servinglab's model (`handlers/servinglab_triton_model.py`) with that folder first on its path,
then this interpreter's site-packages (torch, pillow): :meth:`TritonEnv.stub_paths`.

Built by `hack/triton-env.sh` (`make triton-env`, which CI runs) or `python -m servinglab.servers.triton.env`;
found by the local Triton (:mod:`.local`) and the test cluster's stand-in kubelet. `SERVINGLAB_TRITON_HOME`
names another finished folder (a container image's).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REQUIREMENTS = Path(__file__).with_name("requirements.txt")
#: What the stub is told to put on its path (it ignores PYTHONPATH): folders, os.pathsep-separated.
SITE_ENV = "SERVINGLAB_TRITON_SITE"
HOME_ENV = "SERVINGLAB_TRITON_HOME"
#: The launcher written into the environment's bin/ (on PATH in the Triton image).
LAUNCHER = "servinglab-tritonserver"
_COMPLETE = ".complete"


class TritonEnvMissing(RuntimeError):
    """No finished Triton environment; the message says how to make one."""


@dataclass(frozen=True)
class TritonEnv:
    """A finished Triton environment."""

    root: Path

    @property
    def site(self) -> Path:
        return self.root / "site"

    @property
    def server_dir(self) -> Path:
        return self.site / "pytriton" / "tritonserver"

    @property
    def tritonserver(self) -> Path:
        return self.server_dir / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.server_dir / "backends"

    @property
    def launcher(self) -> Path:
        """`tritonserver` with this environment's backends and the stub's packages (a server pod's command)."""
        return self.root / "bin" / LAUNCHER

    @property
    def perf_analyzer(self) -> Path:
        return self.site / "bin" / "perf_analyzer"

    @property
    def lib(self) -> Path:
        """Shared libraries the binaries look for by their usual names (libcudart.so.12 for perf_analyzer)."""
        return self.root / "lib"

    def stub_paths(self) -> list[str]:
        """The stub's import path: this environment's numpy 1 first, then this interpreter's packages."""
        return [str(self.site), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]


def key() -> str:
    """The environment's cache key: the requirements, the Python version (the stub is per version) and the
    interpreter whose packages the launcher names."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes())
    digest.update(
        f"{sys.version_info.major}.{sys.version_info.minor}\0{os.path.realpath(sys.prefix)}\0{LAUNCHER_VERSION}".encode()
    )
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servinglab" / "triton"


def find_env() -> TritonEnv:
    """The finished environment (SERVINGLAB_TRITON_HOME, else the cached one), or :class:`TritonEnvMissing`."""
    override = os.environ.get(HOME_ENV)
    root = Path(override) if override else cache_root() / key()
    if not (root / _COMPLETE).exists():
        raise TritonEnvMissing(
            f"TritonNotInstalled: no Triton environment at {root}; make one with `make triton-env` "
            "(hack/triton-env.sh, a few minutes once: it installs servinglab/servers/triton/requirements.txt)"
        )
    return TritonEnv(root)


def ensure(quiet: bool = True) -> TritonEnv:
    """The cached environment, installed first when missing (pip, from the package index)."""
    try:
        return find_env()
    except TritonEnvMissing:
        if os.environ.get(HOME_ENV):
            raise
    root = cache_root() / key()
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps",
                   "--no-compile", "--target", str(staging / "site"), "-r", str(REQUIREMENTS)]  # fmt: skip
        subprocess.run([*command, *(["-q"] if quiet else [])], check=True)
        _finish(TritonEnv(staging))
        (staging / _COMPLETE).write_text(f"{time.time():.0f}\n")
        try:
            staging.rename(root)
        except OSError:  # another install finished first: keep that one
            if not (root / _COMPLETE).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return find_env()


def _finish(env: TritonEnv) -> None:
    """The Python backend runs the stub it finds beside itself: this interpreter's version, out of the wheel's
    per-version stubs (PyTriton copies it at run time; here it is done once). Then the launcher."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = env.server_dir / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonEnvMissing(f"TritonNotInstalled: the Triton wheel has no Python backend stub for Python {version}")
    shutil.copy2(stub, env.backends / "python" / stub.name)
    env.lib.mkdir(exist_ok=True)
    cudart = sorted((env.site / "nvidia_pytriton.libs").glob("libcudart-*.so.12*"))
    if cudart:
        (env.lib / "libcudart.so.12").symlink_to(os.path.relpath(cudart[0], env.lib))
    env.launcher.parent.mkdir(exist_ok=True)
    env.launcher.write_text(_launcher(env))
    env.launcher.chmod(0o755)


#: Bumped when the launcher changes, so environments are made anew.
LAUNCHER_VERSION = "1"


def _launcher(env: TritonEnv) -> str:
    """A POSIX sh script that runs this environment's tritonserver from wherever the environment lies (paths
    relative to the script): its backends, and the stub's packages and libpython unless the caller set them."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    site = os.pathsep.join(dict.fromkeys(env.stub_paths()[1:]))
    server = env.tritonserver.relative_to(env.root)
    backends = env.backends.relative_to(env.root)
    return f"""#!/bin/sh
# tritonserver of the servinglab Triton environment (written by servinglab.servers.triton.env)
root=$(cd "$(dirname "$0")/.." && pwd)
: "${{{SITE_ENV}:=$root/site{os.pathsep}{site}}}"
export {SITE_ENV}
export LD_LIBRARY_PATH="{libdir}:$root/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
exec "$root/{server}" --backend-directory="$root/{backends}" "$@"
"""


def main() -> None:
    """Make (or find) the cached environment and say where it is (hack/triton-env.sh)."""
    started = time.monotonic()
    found = ensure(quiet=False)
    print(f"Triton environment: {found.root} ({time.monotonic() - started:.0f} s)")
