"""What each server supports, declared once (servinglab.api.servers): the registry names every kind the
spec knows, each server carries its declaration, and the declarations drive validation (a format or form a
server does not declare is refused naming the field), the sweep's grid (a combination a server does not
declare is left out, with its reason), Triton's native backends, the verdict's reading of the workers'
stages, and the README's table (generated from them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest

from servinglab import servers
from servinglab.api import ServerKind, ServerSpec, SpecError, grid, parse_experiment, parse_sweep
from servinglab.api import servers as caps
from servinglab.api.results import LevelResult, ServerSettings
from servinglab.api.sweep import left_out
from servinglab.api.verdicts import Bottleneck
from servinglab.measure.verdict import judge
from support.manifests import experiment, sweep

README = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists()) / "README.md"


def _readme_table() -> str:
    lines = README.read_text().splitlines()
    start = lines.index(caps.TABLE_HEADER)
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return "\n".join(lines[start:end]) + "\n"


def test_the_readmes_table_of_what_each_server_supports_is_the_one_the_declarations_generate() -> None:
    assert _readme_table() == caps.capabilities_table(), "regenerate it: python -m servinglab.api.servers"


def test_the_registry_names_every_kind_and_each_server_carries_its_own_declaration() -> None:
    kinds = list(get_args(ServerKind))
    assert list(servers.REGISTRY) == kinds == list(caps.CAPABILITIES)
    for kind in kinds:
        server = servers.get(kind)
        assert server.kind == kind and server.capabilities is caps.CAPABILITIES[kind]
        assert server.name == caps.CAPABILITIES[kind].name
    with pytest.raises(ValueError, match="unknown server kind 'tgi'"):
        servers.get("tgi")  # type: ignore[arg-type]


def _experiment(kind: str, fmt: str) -> dict[str, Any]:
    return experiment("mine", model={"name": "mine", "source": {"path": "/models/mine.mar", "format": fmt}},
                      server={"kind": kind})  # fmt: skip


@pytest.mark.parametrize("kind", ["litserve", "triton"])
def test_a_declared_format_the_server_does_not_serve_is_refused_naming_the_field(kind: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_experiment(_experiment(kind, "mar"))
    message = str(refused.value)
    assert "spec.model.source.format" in message and f"spec.server.kind: {kind}" in message
    assert "does not serve a mar model" in message and "torchscript or exported or onnx" in message
    assert parse_experiment(_experiment("torchserve", "mar")).spec.server.kind == "torchserve"
    # `auto` is decided from the file: refused when the server prepares it (ModelNotSupported)
    assert parse_experiment(_experiment(kind, "auto")).spec.server.kind == kind


def test_a_sweep_that_would_serve_a_declared_format_on_a_server_without_it_is_refused_naming_both() -> None:
    space = {"kind": {"values": ["torchserve", "litserve"]}, "batchSize": {"values": [1, 4]}}
    document = sweep("mar-servers", template=_experiment("torchserve", "mar")["spec"], strategy="grid", space=space)
    with pytest.raises(SpecError) as refused:
        parse_sweep(document)
    message = str(refused.value)
    assert "every form on litserve is refused" in message and "spec.model.source.format: LitServe" in message
    assert "on torchserve" not in message


@pytest.fixture
def litserve_without_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    """LitServe declared without the TensorRT form (the declarations are data: what a server states)."""
    declared = caps.CAPABILITIES["litserve"]
    forms = tuple(form for form in declared.forms if form != "tensorrt")
    monkeypatch.setitem(caps.CAPABILITIES, "litserve", declared.model_copy(update={"forms": forms}))


@pytest.mark.usefixtures("litserve_without_tensorrt")
def test_a_form_the_server_does_not_declare_is_refused_naming_the_field() -> None:
    problem = ServerSpec(kind="torchserve", form="tensorrt", gpus=1).form_problem()  # type: ignore[arg-type]
    assert problem is None
    with pytest.raises(ValueError, match=r"spec.server.form: LitServe \(spec.server.kind: litserve\) does not serve"):
        ServerSpec(kind="litserve", form="tensorrt", gpus=1)  # type: ignore[arg-type]


@pytest.mark.usefixtures("litserve_without_tensorrt")
def test_the_grid_leaves_out_a_form_a_server_does_not_declare_on_that_server_alone() -> None:
    document = sweep("forms-servers", template={"model": {"name": "tiny"}, "server": {"gpus": 1}}, strategy="grid",
                     space={"kind": {"values": ["torchserve", "litserve"]}, "form": {"values": ["eager", "tensorrt"]},
                            "batchSize": {"values": [1, 4]}})  # fmt: skip
    spec = parse_sweep(document).spec
    tried = {(config.kind, str(config.form)) for config in grid(spec)}
    assert tried == {("torchserve", "eager"), ("torchserve", "tensorrt"), ("litserve", "eager")}
    pruned = left_out(spec)
    assert {(config.kind, str(config.form), config.batch_size) for config, _ in pruned} == {
        ("litserve", "tensorrt", 1), ("litserve", "tensorrt", 4)}  # fmt: skip
    assert all("spec.server.form: LitServe" in why for _, why in pruned)


def test_tritons_native_backends_are_the_ones_it_declares() -> None:
    from servinglab.servers.triton import native  # the test reads Triton's own table, as its folder's tests do

    declared = caps.CAPABILITIES["triton"].native_backends
    assert declared and set(declared.values()) == set(native._BACKENDS), "a declared backend Triton cannot lay out"
    assert {form: backend.backend for form, backend in native.NATIVE.items()} == declared
    assert not caps.CAPABILITIES["torchserve"].native_backends and not caps.CAPABILITIES["litserve"].native_backends


def _busy_forward_pass() -> LevelResult:
    """Workers busy 80 % of the window, the forward pass (or the server's execution) the largest stage."""
    return LevelResult.model_validate({
        "concurrency": 8, "throughputRps": 80.0, "requests": 160, "errors": 0, "windowSeconds": 2.0,
        "latencyMs": {"mean": 100.0, "p99": 100.0},
        "generator": {"cpuPercent": 1.0, "sendGapMs": {"p50": 0.07, "p99": 0.3}, "saturated": False},
        "server": {"queueMsMean": 40.0, "serverLatencyMsMean": 98.0, "preprocessMsPerBatch": 2.0,
                   "inferenceMsPerBatch": 50.0, "postprocessMsPerBatch": 1.0, "meanBatchSize": 8.0,
                   "batches": 30.0, "serverRequests": 240.0},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "said"),
    [("torchserve", "the forward pass 94%"), ("litserve", "the forward pass 94%"),
     ("triton", "the model's execution (decoding included) 94%"), (None, "the forward pass 94%")],
)  # fmt: skip
def test_the_verdict_reads_the_stages_as_the_servers_declared_signals_say(kind: str | None, said: str) -> None:
    settings = ServerSettings(kind=kind, batch_size=8, max_batch_delay_ms=5, workers=1)
    verdict = judge(_busy_forward_pass(), settings)
    assert verdict.bottleneck == Bottleneck.COMPUTE and said in verdict.because
