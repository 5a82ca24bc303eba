"""`server.dataPath` in specs and sweeps: refusals that name the setting, the data path as sweep axes (a
grid without meaningless combinations, DNS-safe trial names, the search climbing every variant), and
what the handler is told."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from servinglab.api import SpecError, TrialConfig, grid, parse_experiment, parse_sweep, trial_name, trial_spec
from servinglab.api.sweep import data_paths
from servinglab.servers.torchserve.config import render_model_config
from servinglab.sweep.search import Outcome, best, propose
from support import manifests
from support.paths import EXAMPLES


def experiment(server: dict[str, Any]) -> dict[str, Any]:
    return manifests.experiment("dp", server=server)


def sweep(space: dict[str, Any], server: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    template = {"model": {"name": "tiny"}, "server": server or {"gpus": 1}}
    return manifests.sweep("datapath-sweep", template=template, space=space, **spec)


@pytest.mark.parametrize(
    ("data_path", "named"),
    [({"decode": "device"}, "dataPath.decode: device (torchvision's decode_jpeg runs on CUDA) needs a GPU"),
     ({"pinnedCopies": True}, "dataPath.pinnedCopies: true (pinned memory and side streams are CUDA's) needs a GPU"),
     ({"compile": "reduce-overhead"}, "dataPath.compile: reduce-overhead (CUDA graphs) needs a GPU")],
)  # fmt: skip
def test_a_gpu_path_with_gpus_0_is_refused_naming_the_setting(data_path: dict[str, Any], named: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_experiment(experiment({"gpus": 0, "dataPath": data_path}))
    assert f"spec.server: {named}, and gpus is 0" in str(caught.value)
    assert parse_experiment(experiment({"gpus": 1, "dataPath": data_path})).spec.server.data_path.gpu_only()


@pytest.mark.parametrize(
    ("data_path", "named"),
    [({"decode": "device", "decodeThreads": 4}, "decodeThreads: 4 applies to decode: cpu"),
     ({"decode": "device", "transfer": "float"}, "transfer: float converts on the CPU"),
     ({"decodeThreads": 0}, "spec.server.dataPath.decodeThreads: 0 is below the minimum 1"),
     ({"compile": "fast"}, "spec.server.dataPath.compile: 'fast' is not one of")],
)  # fmt: skip
def test_meaningless_or_unknown_data_paths_are_refused(data_path: dict[str, Any], named: str) -> None:
    with pytest.raises(SpecError, match=named):
        parse_experiment(experiment({"dataPath": data_path}))


def test_the_handler_is_told_the_data_path_and_defaults_say_nothing_new() -> None:
    server = parse_experiment(experiment({"dataPath": {"decodeThreads": 4, "compile": "default"}})).spec.server
    handler = yaml.safe_load(render_model_config(server))["handler"]
    assert handler["dataPath"] == {"decode": "cpu", "decodeThreads": 4, "transfer": "uint8", "pinnedCopies": False,
                                   "compile": "default"}  # fmt: skip
    default = parse_experiment(experiment({})).spec.server.data_path
    assert default.label() == "" and default.gpu_only() == [] and "channelsLast" not in default.handler_settings()


def test_data_path_axes_combine_without_the_meaningless_and_name_their_trials() -> None:
    space = {"decode": {"values": ["cpu", "device"]}, "decodeThreads": {"values": [1, 4]},
             "compile": {"values": ["none", "reduce-overhead"]}, "channelsLast": {"values": [True, False]},
             "batchSize": {"values": [8, 256]}}  # fmt: skip
    parsed = parse_sweep(sweep(space, {"gpus": 1, "maxBatchDelayMs": 100, "workers": 16}))
    configs = grid(parsed.spec)
    # decode device with 4 threads means nothing: 3 decodes x 2 compiles x 2 layouts, at 2 batch sizes
    assert len(configs) == 3 * 2 * 2 * 2
    assert not any(c.path.decode == "device" and c.path.decode_threads > 1 for c in configs)
    names = [trial_name(parsed.metadata.name, c) for c in configs]
    assert len(set(names)) == len(names)
    assert all(len(n) <= 52 and n == n.lower() and n.replace("-", "").isalnum() for n in names)
    assert "datapath-sweep-b256-d100-w16-fp32-t4-cro-nocl" in names
    device = next(c for c in configs if c.path.decode == "device")
    assert trial_spec(parsed.spec, device).server.data_path.decode == "device"


def test_a_sweep_refuses_gpu_paths_on_a_cpu_template_and_listed_configs_keep_the_templates_path() -> None:
    with pytest.raises(SpecError, match=r"space: dataPath.pinnedCopies: true .* template.server.gpus is 0"):
        parse_sweep(sweep({"pinnedCopies": {"values": [False, True]}}, {"gpus": 0}))
    with pytest.raises(SpecError, match="space: every combination of the data-path axes conflicts"):
        parse_sweep(sweep({"decode": {"values": ["device"]}, "transfer": {"values": ["float"]}}))
    listed = parse_sweep(sweep({}, {"gpus": 0, "dataPath": {"decodeThreads": 2}}, strategy="list", configurations=[
        {"batchSize": 1, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32"},
        {"batchSize": 1, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32", "dataPath": {"transfer": "float"}},
    ]))  # fmt: skip
    assert [c.label() for c in grid(listed.spec)] == ["b1-d5-w1-fp32-t2", "b1-d5-w1-fp32-ft"]


def test_the_search_screens_and_climbs_every_data_path_variant() -> None:
    space = {"batchSize": {"values": [1, 2, 4, 8]}, "decodeThreads": {"values": [1, 2, 4]},
             "compile": {"values": ["none", "default"]}}  # fmt: skip
    spec = parse_sweep(sweep(space, {"gpus": 0})).spec

    def surface(config: TrialConfig) -> Outcome:  # decode threads help up to 2, compiling adds 10 %
        threads = min(config.path.decode_threads, 2) * (0.9 if config.path.decode_threads == 4 else 1.0)
        return Outcome(config, 10 * config.batch_size * threads * (1.1 if config.path.compile == "default" else 1))

    history: list[Outcome] = []
    while proposal := propose(spec, history, [], 1).configs:
        history.append(surface(proposal[0]))
    screened = {c.config.path.label() for c in history[:6]}
    assert screened == {"", "t2", "t4", "cd", "t2-cd", "t4-cd"}  # every variant at the start point first
    found = best(history)
    assert found is not None and found.config.label() == "b8-d50-w1-fp32-t2-cd"
    assert len(history) < len(grid(spec))


def test_the_data_path_examples_are_valid_sweeps() -> None:
    from servinglab.api import load_sweep

    examples = EXAMPLES
    gpu = load_sweep(examples / "sweep-datapath-gpu.yaml").spec
    assert len(data_paths(gpu)) == 2 * 2 * 2 + 1 * 2  # device decode takes neither threads nor pinned copies
    cpu = load_sweep(examples / "sweep-datapath-cpu.yaml").spec
    assert len(grid(cpu)) == 2 * 2 * 2 * 2 and not any(p.gpu_only() for p in data_paths(cpu))


@pytest.mark.parametrize(
    ("data_path", "named"),
    [({"decodeThreads": 4}, "spec.server.dataPath.decodeThreads: 4: Triton (spec.server.kind: triton) would ignore"),
     ({"channelsLast": False}, "spec.server.dataPath.channelsLast: False: Triton"),
     ({"transfer": "float"}, "spec.server.dataPath.transfer: float: Triton")],
)  # fmt: skip
def test_triton_refuses_the_data_path_settings_its_model_would_ignore(data_path: dict[str, Any], named: str) -> None:
    """Triton's Python model decodes and batches the requests itself: only dataPath.compile reaches it, so any
    other setting would be measured as if it ran. The same settings run on TorchServe and LitServe."""
    with pytest.raises(SpecError, match=re.escape(named)):
        parse_experiment(experiment({"kind": "triton", "gpus": 1, "dataPath": data_path}))
    for kind in ("torchserve", "litserve"):
        assert parse_experiment(experiment({"kind": kind, "gpus": 1, "dataPath": data_path})).spec.server.data_path
    compiled = parse_experiment(experiment({"kind": "triton", "dataPath": {"compile": "default"}}))
    assert compiled.spec.server.compile_mode() == "default"


def test_a_kind_axis_leaves_out_triton_with_a_data_path_it_would_ignore() -> None:
    space = {"kind": {"values": ["torchserve", "triton"]}, "decodeThreads": {"values": [1, 4]}}
    configs = grid(parse_sweep(sweep(space, {"gpus": 1})).spec)
    assert sorted((c.kind, c.path.decode_threads) for c in configs) == [
        ("torchserve", 1), ("torchserve", 4), ("triton", 1)]  # fmt: skip
