"""Image references are checked by the grammar the container runtime parses them with (registry host and
port, lowercase path components, tag, digest), so a bad one is refused when the spec is read, naming the
field and the value, not at pull time; `latest` and untagged images stay refused."""

from __future__ import annotations

import pytest

from servinglab.api import SpecError, parse_experiment
from servinglab.k8s.settings import Settings
from support.manifests import experiment

DIGEST = "sha256:" + "0123456789abcdef" * 4


def with_image(image: str) -> dict[str, object]:
    return experiment("images", server={"image": image})


@pytest.mark.parametrize(
    "image",
    [
        "pytorch/torchserve:0.12.0-gpu",
        "nvcr.io/nvidia/tritonserver:24.08-py3",
        "localhost:5000/team/server:1",
        "registry.example.com:443/a/my_model__x.y-z--w:v1.2_3",
        f"pytorch/torchserve@{DIGEST}",
        f"pytorch/torchserve:0.12.0@{DIGEST}",
        "server:" + "v" * 128,
    ],
)
def test_good_references_pass(image: str) -> None:
    assert parse_experiment(with_image(image)).spec.server.image == image


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("PyTorch/torchserve:1.0", "the path component 'PyTorch' is not lowercase"),
        ("registry.example.com/Team/server:1.0", "the path component 'Team' is not lowercase"),
        ("pytorch/torchserve:1.0+cu12", "the tag '1.0+cu12' is not 1 to 128"),
        ("pytorch/torchserve:.hidden", "the tag '.hidden' is not"),
        ("pytorch/torchserve:" + "v" * 129, "is not 1 to 128"),
        ("pytorch/torchserve@sha256:abc123", "'sha256:abc123' is not a digest"),
        ("pytorch/torchserve@md5:" + "0" * 32, "is not a digest"),
        ("pytorch//torchserve:1.0", "an empty path component"),
        ("pytorch/torchserve-:1.0", "the path component 'torchserve-'"),
        ("bad_host:5000x/server:1", "'bad_host:5000x' is not a registry host[:port]"),
        ("pytorch/torchserve:latest", "uses the moving tag 'latest'"),
        ("pytorch/torchserve", "has no tag"),
    ],
)
def test_bad_references_are_refused_naming_the_field_and_value(image: str, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_experiment(with_image(image))
    found = info.value.problems
    assert any(p.startswith(f"spec.server.image: '{image}'") and expected in p for p in found), found


def test_the_operator_s_experiment_image_is_checked_when_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVINGLAB_IMAGE", "Registry.example.com/ServingLab:1")
    with pytest.raises(ValueError, match=r"^SERVINGLAB_IMAGE: 'Registry.example.com/ServingLab:1': the path component"):
        Settings.from_env()
    monkeypatch.setenv("SERVINGLAB_IMAGE", "registry.example.com/servinglab:1")
    assert Settings.from_env().servinglab_image == "registry.example.com/servinglab:1"
