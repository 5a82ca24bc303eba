"""Building the built-in models: deterministic weights, rebuilt only when inputs change; laid out for
TorchServe with servinglab's handler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from servinglab.models import builtins, catalogue
from servinglab.models.build import build
from servinglab.servers.torchserve.config import ARCHIVE_VERSION


def test_archive_is_a_no_archive_directory_with_our_handler(tiny_archive: Path) -> None:
    manifest = json.loads((tiny_archive / "MAR-INF" / "MANIFEST.json").read_text())["model"]
    assert manifest["handler"] == "servinglab_image_handler.py"
    assert manifest["modelVersion"] == ARCHIVE_VERSION
    assert manifest["configFile"] == "model-config.yaml"
    assert (tiny_archive / "servinglab_imaging.py").exists()


def test_rebuild_is_skipped_when_inputs_are_unchanged(tmp_path: Path) -> None:
    archive, rebuilt = build("tiny", tmp_path)
    assert rebuilt
    stamp = archive.parent / builtins.STAMP_FILE
    first_weights = (archive / builtins.WEIGHTS_FILE).stat().st_mtime_ns
    again, rebuilt_again = build("tiny", tmp_path)
    assert again == archive and not rebuilt_again
    assert (archive / builtins.WEIGHTS_FILE).stat().st_mtime_ns == first_weights
    stamp.write_text("stale\n")  # as if an input had changed
    assert not builtins.is_current("tiny", tmp_path)
    _, rebuilt_after_change = build("tiny", tmp_path)
    assert rebuilt_after_change


def test_weights_are_identical_across_builds(tmp_path: Path, tiny_archive: Path) -> None:
    archive, _ = build("tiny", tmp_path / "other")
    ours = torch.load(archive / builtins.WEIGHTS_FILE, weights_only=True)
    theirs = torch.load(tiny_archive / builtins.WEIGHTS_FILE, weights_only=True)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_digest_changes_with_the_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = catalogue.get_builtin("tiny")
    reseeded = catalogue.BuiltinModel(
        tiny.name, tiny.seed + 1, tiny.calibration_batches, tiny.calibration_batch_size, tiny.description
    )
    assert builtins.input_digest(reseeded) != builtins.input_digest(tiny)


def test_model_info_reads_sizes_without_torch() -> None:
    assert catalogue.model_info("resnet50") == catalogue.ModelInfo("resnet50", 224, 1000)
    assert catalogue.model_info("tiny").input_size == 32
    with pytest.raises(ValueError, match="unknown built-in model 'vgg'"):
        catalogue.get_builtin("vgg")


def test_resnet50_has_resnet50_parameter_count() -> None:
    module = catalogue.load_module(catalogue.get_builtin("resnet50").source)
    network = module.build_model()
    assert sum(p.numel() for p in network.parameters()) == 25_557_032  # torchvision resnet50
