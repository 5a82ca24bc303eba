"""The ceiling per form (pure, on constructed figures): the model alone runs in the form that was served,
the best form alone at the same batch is named with its gain, and near the raw ceiling in a slow form the
verdict (and so the guided search) points at the faster form before a faster device."""

from __future__ import annotations

from pathlib import Path

from servinglab.api import ServerSpec, SweepSpec
from servinglab.api.ceiling import Ceiling, FormAlone, RawRow
from servinglab.api.results import LevelResult, ServerSettings
from servinglab.api.verdicts import Bottleneck, CpuFigures, Verdict, VerdictHint
from servinglab.measure.ceiling import best_form, served_form_options
from servinglab.measure.verdict import judge
from servinglab.sweep.search import Outcome, propose

SETTINGS = ServerSettings(batch_size=8, max_batch_delay_ms=5, workers=1)


def level(rps: float = 80.0) -> LevelResult:
    """A level whose workers were busy computing at a formed batch of 8 (the raw table decides the rest)."""
    return LevelResult.model_validate({
        "concurrency": 8, "throughputRps": rps, "requests": 160, "errors": 0, "windowSeconds": 2.0,
        "latencyMs": {"mean": 100.0, "p99": 100.0},
        "generator": {"cpuPercent": 1.0, "sendGapMs": {"p50": 0.07, "p99": 0.3}, "saturated": False},
        "server": {"queueMsMean": 40.0, "serverLatencyMsMean": 98.0, "preprocessMsPerBatch": 2.0,
                   "inferenceMsPerBatch": 50.0, "postprocessMsPerBatch": 1.0, "meanBatchSize": 8.0,
                   "batches": 30.0, "serverRequests": 240.0},
        "cpu": CpuFigures(cores_busy=0.3, cores_wanted=1.6, cores=2).model_dump(by_alias=True),
    })  # fmt: skip


def alone(**rps: float) -> list[FormAlone]:
    return [FormAlone(form=form, status="measured", throughput_rps=value) for form, value in rps.items()] + [
        FormAlone(form="tensorrt", status="refused", reason="TensorRT needs a GPU")]  # fmt: skip


def ceiling(rows: list[FormAlone] | None, served: str = "eager") -> Ceiling:
    return Ceiling(flops_per_inference=1, raw_table=[RawRow(batch_size=8, throughput_rps=90.0)],
                   raw_best_batch_size=8, form=served,
                   forms_alone=rows, best_form=best_form(served, rows) if rows else None)  # fmt: skip


def test_the_best_form_alone_is_named_with_its_gain_over_the_served_form() -> None:
    found = best_form("eager", alone(eager=90.0, torchscript=110.0, compile=150.0, onnxruntime=180.0))
    assert found is not None and (found.form, found.rps, found.served_form_rps, found.gain) == (
        "onnxruntime", 180.0, 90.0, 2.0)  # fmt: skip
    same = best_form("onnxruntime", alone(eager=90.0, onnxruntime=180.0))
    assert same is not None and (same.form, same.gain) == ("onnxruntime", 1.0)
    assert best_form("compile", alone(eager=90.0)) is None, "the served form not measured alone: no gain to state"


def test_near_the_raw_ceiling_in_eager_form_the_verdict_points_at_the_faster_form_before_a_faster_device() -> None:
    faster = judge(level(), SETTINGS, ceiling(alone(eager=90.0, torchscript=100.0, onnxruntime=180.0)))
    assert faster.bottleneck == Bottleneck.RAW_CEILING
    assert faster.next.startswith("near the raw ceiling in eager form: the onnxruntime form alone runs 2x faster")
    assert "try server.form: onnxruntime (before a faster device)" in faster.next
    assert [(h.axis, h.value) for h in faster.hints] == [("form", "onnxruntime")]
    for rows in (None, alone(eager=90.0, torchscript=95.0)):  # no figures, or no form much faster
        plain = judge(level(), SETTINGS, ceiling(rows))
        assert plain.bottleneck == Bottleneck.RAW_CEILING and "faster device" in plain.next
        assert "server.form" not in plain.next and plain.hints == []
    served_best = judge(level(), SETTINGS, ceiling(alone(eager=50.0, onnxruntime=90.0), served="onnxruntime"))
    assert "server.form" not in served_best.next, "already served in the best form"


def test_the_guided_search_tries_the_faster_form_first_at_the_raw_ceiling() -> None:
    spec = SweepSpec.model_validate({
        "template": {"model": {"name": "tiny"}, "server": {"gpus": 0}, "slo": {"p99LatencyMs": 200}},
        "space": {"batchSize": {"values": [4, 8, 16]}, "workers": {"values": [1, 2]},
                  "form": {"values": ["eager", "torchscript", "onnxruntime"]}},
    })  # fmt: skip
    screening = propose(spec, [], [], 10).configs
    assert sorted(str(c.form) for c in screening) == ["eager", "onnxruntime", "torchscript"]
    history = [Outcome(c, 100.0 if c.form == "eager" else 60.0) for c in screening]
    eager = next(o.config for o in history if o.config.form == "eager")
    hint = VerdictHint(axis="form", step=1, value="onnxruntime")
    at_ceiling = Verdict(bottleneck=Bottleneck.RAW_CEILING, because="-", next="-", served_over_raw=0.95,
                         hints=[hint])  # fmt: skip
    climbed = eager.model_copy(update={"batch_size": 16})
    history.append(Outcome(climbed, 120.0, verdict=at_ceiling))
    (first,) = propose(spec, history, [], 1).configs
    assert (first.form, first.batch_size, first.workers) == ("onnxruntime", 16, 1)
    plain = Verdict(bottleneck=Bottleneck.RAW_CEILING, because="-", next="-", served_over_raw=0.95)
    history[-1] = Outcome(climbed, 120.0, verdict=plain)
    proposal = propose(spec, history, [], 1)
    assert proposal.configs == [] and (proposal.stop_reason or "").startswith("at the model's raw ceiling")


def test_the_model_alone_runs_in_the_served_form(tmp_path: Path) -> None:
    (tmp_path / "servinglab-form.onnx").write_bytes(b"onnx")
    served = served_form_options(ServerSpec.model_validate({"form": "onnxruntime", "gpus": 0}), tmp_path)
    assert served == {"form": "onnxruntime", "formFile": str(tmp_path / "servinglab-form.onnx")}
    compiled = served_form_options(ServerSpec.model_validate({"form": "compile", "gpus": 0, "batchSize": 4}), tmp_path)
    assert compiled == {"compile": "default", "batchSize": 4, "form": "compile"}
    assert served_form_options(ServerSpec.model_validate({"gpus": 0}), tmp_path) == {}
