"""The Dockerfiles and the pins they install agree with pyproject.toml (the images themselves are
built and run in tests/containers and tests/k8s/real_node/test_real_node.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from support.paths import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DOCKERFILES = [ROOT / "operator/Dockerfile", ROOT / "loadtests/Dockerfile", ROOT / "hack/images/pause/Dockerfile"]


def pins(requirements: list[str]) -> dict[str, str]:
    found = {}
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", requirement)
        assert match, f"{requirement!r} is not pinned with =="
        found[match.group(1).lower().replace("_", "-")] = match.group(2)
    return found


def test_the_operator_image_installs_the_packages_pins() -> None:
    package = pins(PROJECT["project"]["dependencies"])
    operator = pins(PROJECT["dependency-groups"]["operator"])
    differing = {name: (version, package[name]) for name, version in operator.items()
                 if name in package and package[name] != version}  # fmt: skip
    assert not differing, f"the operator group disagrees with [project.dependencies]: {differing}"
    assert {"kopf", "kubernetes-asyncio", "aiohttp"} <= operator.keys()
    assert "torch" not in operator and "locust" not in operator


def test_the_load_image_installs_the_pinned_torch_from_a_configurable_index() -> None:
    text = (ROOT / "loadtests/Dockerfile").read_text()
    torch = pins([r for r in PROJECT["project"]["dependencies"] if r.startswith("torch==")])["torch"]
    assert f'torch=={torch} --index-url "$TORCH_INDEX_URL"' in text
    assert re.search(r"^ARG TORCH_INDEX_URL=https://\S+$", text, flags=re.MULTILINE)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_image_takes_its_base_as_a_build_argument(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert "ARG BASE_IMAGE=python:3.11.11-slim-bookworm" in text
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, flags=re.MULTILINE)
    # the only hosts a build reaches are the base image's registry, PyPI and the torch index argument
    hosts = set(re.findall(r"https?://([^/\s\"]+)", text))
    assert hosts <= {"download.pytorch.org"}, hosts


def test_no_build_secret_or_certificate_is_copied_into_an_image() -> None:
    for dockerfile in [
        *DOCKERFILES,
        ROOT / "hack/images/torchserve/Dockerfile",
        ROOT / "hack/images/litserve/Dockerfile",
    ]:
        text = dockerfile.read_text()
        assert not re.search(r"^(COPY|ADD)\s.*(\.crt|\.pem|ca-certificates)", text, flags=re.MULTILINE), dockerfile
        assert "PIP_CERT=/run/secrets/ca-bundle" in text or "pip install" not in text, dockerfile


def test_the_litserve_image_is_the_one_litserve_pods_default_to_with_the_pinned_litserve() -> None:
    from servinglab.servers.litserve import DEFAULT_IMAGE

    version = PROJECT["project"]["version"]
    assert f"servinglab/litserve:{version}" == DEFAULT_IMAGE
    assert (
        'build "servinglab/litserve:$version" hack/images/litserve/Dockerfile' in (ROOT / "hack/images.sh").read_text()
    )
    litserve = pins([r for r in PROJECT["project"]["dependencies"] if r.startswith("litserve==")])["litserve"]
    assert f"pip install litserve=={litserve}" in (ROOT / "hack/images/litserve/Dockerfile").read_text()
