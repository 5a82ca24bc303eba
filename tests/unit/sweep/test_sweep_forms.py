"""The model's form as a sweep axis: the grid leaves out what a form cannot run (listed with the reason),
trial names stay short and distinct, and a trial whose form disagreed with eager fp32 is a named failure,
never ranked, never the best of the sweep or of its server, never a candidate, a point or the export."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from servinglab.api import SpecError, grid, load_sweep, parse_sweep, space_size, trial_name, trial_spec
from servinglab.api.results import ExperimentResults
from servinglab.api.trials import INFEASIBLE, SUCCEEDED, TrialRecord
from servinglab.k8s.sweep.reconcile import config_of, trial_manifest
from servinglab.models import forms
from servinglab.present.tables import print_sweep
from servinglab.sweep import confirm, rollup
from servinglab.sweep.export import best_files
from servinglab.sweep.search import propose
from support.manifests import sweep
from support.paths import EXAMPLES

FORMS = ["eager", "torchscript", "compile", "onnxruntime"]


def document(name: str = "tiny-forms", **spec: Any) -> dict[str, Any]:
    return sweep(name, **{
        "template": {"model": {"name": "tiny"}, "server": {"gpus": 0}, "slo": {"p99LatencyMs": 100}},
        "strategy": "grid",
        "space": {"batchSize": {"values": [1, 8]}, "form": {"values": FORMS}},
        **spec,
    })  # fmt: skip


def level(rps: float) -> dict[str, Any]:
    return {"concurrency": 8, "throughputRps": rps, "latencyMs": {"p99": 40.0}, "requests": 1000, "errors": 0}


def measured(rps: float, form: str, passed: bool = True) -> ExperimentResults:
    gate = {"maxAbsError": 0.0 if passed else 3.5, "maxRelError": 0.0 if passed else 0.4, "tolerance": 1e-3,
            "passed": passed}  # fmt: skip
    runtime = {"mode": "local", "form": {"form": form, "backend": "x", "precision": "fp32", "batchSizes": [1],
                                         "gate": gate}}  # fmt: skip
    return ExperimentResults.model_validate(
        {"experiment": "t", "model": "tiny", "results": [level(rps)], "runtime": runtime}
    )


def test_the_form_axis_is_in_the_grid_and_what_a_form_cannot_run_is_left_out_with_its_reason() -> None:
    sweep = parse_sweep(document(space={"batchSize": {"values": [1, 8]}, "form": {"values": FORMS},
                                        "precision": {"values": ["fp32", "bf16"]}}))  # fmt: skip
    configs = grid(sweep.spec)
    # onnxruntime runs the exported model at fp32 only: 4 forms x 2 precisions - 1, at 2 batch sizes
    assert space_size(sweep.spec) == len(configs) == (4 * 2 - 1) * 2
    assert ("onnxruntime", "bf16") not in {(str(c.form), str(c.precision)) for c in configs}
    assert [str(c.form) for c in configs[:4]] == ["eager"] * 4, "the form outermost: one model build per form"
    assert trial_spec(sweep.spec, configs[-1]).server.form == "onnxruntime"
    left = rollup.document(sweep, [], None, "2026-11-27T00:00:00Z").pruned
    assert {(str(p.config.form), str(p.config.precision), p.config.batch_size) for p in left} == {
        ("onnxruntime", "bf16", 1), ("onnxruntime", "bf16", 8)}  # fmt: skip
    assert all("onnxruntime" in p.reason and "precision: bf16" in p.reason for p in left)
    on_cpu = parse_sweep(document(space={"batchSize": {"values": [1]}, "form": {"values": ["eager", "tensorrt"]}}))
    assert [str(c.form) for c in grid(on_cpu.spec)] == ["eager"], "tensorrt needs a GPU; the template has gpus 0"
    with pytest.raises(SpecError, match="every form is refused") as caught:
        parse_sweep(document(space={"form": {"values": ["onnxruntime"]}, "precision": {"values": ["fp16"]}}))
    assert "onnxruntime" in str(caught.value) and "fp16" in str(caught.value)
    with pytest.raises(SpecError, match="repeat a form"):
        parse_sweep(document(space={"form": {"values": ["eager", "eager"]}}))


def test_form_trial_names_are_distinct_fit_an_experiment_name_and_survive_the_cluster_round_trip() -> None:
    long_name = "a-rather-long-sweep-name-for-the-forms-of-a-model"
    sweep = parse_sweep(document(name=long_name, space={
        "kind": {"values": ["torchserve", "litserve"]}, "batchSize": {"values": [1024]},
        "maxBatchDelayMs": {"values": [60000]}, "workers": {"values": [64]}, "form": {"values": FORMS},
        "decodeThreads": {"values": [1, 64]}, "transfer": {"values": ["uint8", "float"]},
        "channelsLast": {"values": [True, False]}}))  # fmt: skip
    configs = grid(sweep.spec)
    names = [trial_name(long_name, c, repeat) for c in configs for repeat in (0, 3)]
    assert len(set(names)) == len(names) == 2 * len(configs)
    assert max(len(name) for name in names) <= 52
    short = trial_name("s", configs[0])
    assert short.endswith("-eager") and trial_name("s", configs[1]).endswith("-nocl-eager")
    for config in configs[:: len(configs) // 8]:
        child = trial_manifest(sweep, "uid", "default", config, 0)
        assert config_of(child) == config and config_of(child).key() == config.key()


def test_a_form_that_disagreed_is_a_named_failure_never_the_winner_though_it_measured_fastest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sweep = parse_sweep(document(
        space={"kind": {"values": ["torchserve", "litserve"]}, "form": {"values": ["eager", "onnxruntime"]}},
        confirm={"candidates": 2, "rounds": 2}))  # fmt: skip
    ts_eager, ts_ort, ls_eager, ls_ort = grid(sweep.spec)
    # locally: the gate refuses the form before the server starts (the runner's failure message)
    refused = rollup.record(sweep, "t0", 0, ts_ort, None, "FormDisagrees: spec.server.form: onnxruntime "
                            "disagrees with eager fp32 ... build exited with code 0")  # fmt: skip
    assert (refused.state, refused.reason, refused.capacity_rps) == (INFEASIBLE, "FormDisagrees", None)
    # measured, but its results say the gate failed: the fastest figure of the sweep, never counted
    disagreeing = rollup.record(sweep, "t1", 1, ls_ort, measured(900.0, "onnxruntime", passed=False), None)
    assert (disagreeing.state, disagreeing.reason, disagreeing.capacity_rps) == (INFEASIBLE, "FormDisagrees", None)
    assert "largest relative error 0.4" in (disagreeing.message or "")
    # a record written with a capacity (an older roll-up): still never ranked
    stale = TrialRecord(name="t2", order=2, config=ts_ort, state=SUCCEEDED, reason="FormDisagrees",
                        capacity_rps=1000.0, results=measured(1000.0, "onnxruntime"))  # fmt: skip
    fair = [rollup.record(sweep, f"t{3 + i}", 3 + i, c, measured(rps, str(c.form)), None)
            for i, (c, rps) in enumerate([(ts_eager, 300.0), (ls_eager, 200.0)])]  # fmt: skip
    records = [refused, disagreeing, stale, *fair]
    assert [c.name for c in confirm.candidates(sweep.spec, records)] == ["t3", "t4"]
    rolled = rollup.document(sweep, records, "done", "2026-11-27T00:00:00Z")
    assert rolled.best is not None and rolled.best.trial == "t3" and rolled.best.config.form == "eager"
    assert [b.trial for b in rolled.best_per_kind or []] == ["t3", "t4"]
    assert {p.trial for p in rolled.points} == {"t3", "t4"}
    assert [t.reason for t in rolled.trials[:3]] == ["FormDisagrees"] * 3
    assert "form: eager" in best_files(sweep, rolled.best.config)["experiment.yaml"]
    history = [rollup.outcome(r, sweep.spec.objective) for r in records]
    assert all(o.score is None for o in history[:3])
    assert propose(sweep.spec, history, [], 4).configs == [], "every configuration was tried"
    print_sweep(rolled)
    shown = " ".join(capsys.readouterr().out.split())
    assert "Infeasible (FormDisagrees)" in shown and "onnxruntime" in shown
    assert "best on torchserve: batch 1, delay 50 ms, 1 worker(s), fp32, form eager" in shown


def test_the_user_model_forms_example_sweeps_only_forms_its_torchscript_model_can_take(tmp_path: Path) -> None:
    """examples/sweep-user-model-forms.yaml: kind x form x batch over the model examples/make-user-model.py
    writes; every form it sweeps is one servinglab can build from a TorchScript file (none refused)."""
    made = subprocess.run([sys.executable, str(EXAMPLES / "make-user-model.py"), str(tmp_path / "m.pt")],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert "sha256" in made.stdout and (tmp_path / "m.pt").stat().st_size > 0
    sweep = load_sweep(EXAMPLES / "sweep-user-model-forms.yaml")
    source = sweep.spec.template.model.source
    assert source is not None and str(source.path).endswith("user-classifier.pt")
    configs = grid(sweep.spec)
    assert {(c.kind, str(c.form)) for c in configs} == {
        (kind, form) for kind in ("torchserve", "litserve", "triton") for form in ("torchscript", "onnxruntime")
    }
    assert len({c.batch_size for c in configs}) > 1
    for config in configs:
        server = trial_spec(sweep.spec, config).server
        assert forms.refusal(server, 0, "torchscript") is None, config.label()
        assert len(trial_name(sweep.metadata.name, config)) <= 52


def test_a_kind_axis_of_one_server_runs_on_that_server_not_the_templates() -> None:
    for strategy in ("grid", "search"):
        space = {"kind": {"values": ["litserve"]}, "form": {"values": ["eager", "onnxruntime"]}}
        sweep = parse_sweep(document(strategy=strategy, space=space))
        proposed = propose(sweep.spec, [], [], 8).configs
        assert proposed and {c.kind for c in proposed} == {"litserve"}, strategy
        assert all(trial_spec(sweep.spec, c).server.kind == "litserve" for c in proposed)
