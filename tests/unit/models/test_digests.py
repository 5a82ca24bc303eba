"""The shared model cache's manifests are keyed: whoever can write the claim can change a build and rewrite
its digests.json to match, but cannot sign it without the key only the model init container is given. Each
tamper (weights swapped, FLOP count changed, an extra numpy.py for a server's import path), with the
manifest rewritten to match, is found, rebuilt by `servinglab build-model` and never laid out for serving.
Real builds of the tiny model on the real file system; the pod parts that hand the key over."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from servinglab import servers
from servinglab.api import parse_experiment
from servinglab.k8s import builders, modelsecrets
from servinglab.models import builtins as models
from servinglab.models import digests
from servinglab.servers.base import PodInputs
from support.manifests import experiment

KEY = "0123456789abcdef" * 4
FORGER = b"a key of the attacker's choosing"


def build_cmd(servinglab_cmd: list[str], root: Path, *extra: str) -> str:
    env = {**os.environ, digests.KEY_ENV: KEY}
    command = [*servinglab_cmd, "build-model", "tiny", "--build-dir", str(root), *extra]
    return subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture()
def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(digests.KEY_ENV, KEY)


@pytest.fixture()
def builds(tmp_path: Path, servinglab_cmd: list[str]) -> Path:
    root = tmp_path / "cache" / "builtin"
    build_cmd(servinglab_cmd, root, "--quiet")
    return root


def rewrite_manifest(root: Path, key: bytes | None = None) -> None:
    """What whoever tampered does next: a manifest of the files as they now are, today's inputs and all."""
    build = models.build_folder("tiny", root)
    inputs = (build.parent / models.STAMP_FILE).read_text().strip()
    digests.write_manifest(build, build.parent / models.DIGESTS_FILE, key, inputs=inputs)


def swap_weights(build: Path) -> None:
    (build / models.WEIGHTS_FILE).write_bytes(b"other weights")


def change_flops(build: Path) -> None:
    counts = json.loads((build / models.COUNTS_FILE).read_text())
    counts["flopsPerInference"] = counts["flopsPerInference"] * 10
    (build / models.COUNTS_FILE).write_text(json.dumps(counts))


def add_numpy(build: Path) -> None:
    (build / "numpy.py").write_text("raise SystemExit('imported instead of numpy')\n")


TAMPERS = {"weights swapped": swap_weights, "FLOP count changed": change_flops, "numpy.py added": add_numpy}


@pytest.mark.parametrize("tamper", TAMPERS.values(), ids=TAMPERS.keys())
@pytest.mark.parametrize("forged_with", [None, FORGER], ids=["unkeyed manifest", "another key"])
def test_a_tampered_build_with_a_rewritten_manifest_is_rebuilt_never_served(
    builds: Path, tmp_path: Path, servinglab_cmd: list[str], keyed: None,
    tamper: Callable[[Path], None], forged_with: bytes | None,
) -> None:  # fmt: skip
    build = models.build_folder("tiny", builds)
    genuine = {path.name: path.read_bytes() for path in build.iterdir()}
    assert models.is_current("tiny", builds), models.build_difference("tiny", builds)
    tamper(build)
    rewrite_manifest(builds, forged_with)
    assert not models.is_current("tiny", builds)
    assert "not signed with the key" in str(models.build_difference("tiny", builds))
    served = tmp_path / "store" / "tiny"
    said = build_cmd(servinglab_cmd, builds, "--into", str(served), "--server", "litserve")
    assert said.startswith("built:"), said
    assert {path.name: path.read_bytes() for path in build.iterdir()} == genuine
    assert not (served / "numpy.py").exists()
    for name, content in genuine.items():
        assert (served / name).read_bytes() == content


def test_a_signed_manifest_lists_a_build_s_files_and_no_other(builds: Path, keyed: None) -> None:
    """Even a manifest signed with the key (a servinglab of another recipe) must list exactly a build."""
    add_numpy(models.build_folder("tiny", builds))
    rewrite_manifest(builds, KEY.encode())
    assert "not a build's files" in str(models.build_difference("tiny", builds))
    assert not models.is_current("tiny", builds)


def test_without_a_key_a_local_build_is_checked_as_before(tmp_path: Path, servinglab_cmd: list[str]) -> None:
    root = tmp_path / "local"
    subprocess.run([*servinglab_cmd, "build-model", "tiny", "--build-dir", str(root), "--quiet"], check=True)
    assert models.is_current("tiny", root)
    swap_weights(models.build_folder("tiny", root))
    assert not models.is_current("tiny", root)


def test_the_model_init_container_alone_gets_the_cache_key() -> None:
    spec = parse_experiment(experiment("k", server={"kind": "litserve"})).spec
    inputs = PodInputs("k-config", "servinglab:1", model_cache_claim="models",
                       model_cache_key_secret=modelsecrets.MODEL_CACHE_KEY_SECRET)  # fmt: skip
    pod = servers.get("litserve").pod(spec, inputs)
    init, *others = [*pod.init_containers, *pod.containers]
    ref = {"name": modelsecrets.MODEL_CACHE_KEY_SECRET, "key": "key"}
    assert {"name": digests.KEY_ENV, "valueFrom": {"secretKeyRef": ref}} in init["env"]
    assert not any(modelsecrets.MODEL_CACHE_KEY_SECRET in json.dumps(c) for c in others)
    secret = modelsecrets.model_cache_key_secret("bench")
    assert secret["metadata"]["name"] == modelsecrets.MODEL_CACHE_KEY_SECRET and secret["immutable"] is True
    assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == builders.MANAGED_BY
    assert "ownerReferences" not in secret["metadata"], "it outlives experiments, as the cache does"
