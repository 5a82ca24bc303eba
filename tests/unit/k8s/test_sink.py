"""The results document survives whatever its size: stored whole, gzipped, or in parts, and read back
exactly; and whatever a writer puts in the results ConfigMaps, reading them costs the reader a bounded
amount of memory and ends with an error that names what was too large or malformed."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import hashlib
import json
import random
import tracemalloc
import zlib
from typing import Any

import pytest

from servinglab.api import GeneratorLimits, LoadSpec
from servinglab.api.figures import OpenLoopFigures, Repeats, ServerBreakdown
from servinglab.api.results import to_json
from servinglab.k8s import sink as results_sink
from servinglab.k8s.sink import (
    MAX_DOCUMENT_BYTES,
    ResultsMissing,
    ResultsUnreadable,
    SinkError,
    decode_results,
    encode_results,
)
from servinglab.loadgen.stats import Sample, generator_verdict, judge_stability, mean_ci95, summarise
from servinglab.measure.levels import level_results


def windows_document(levels: int, windows: int, seed: int = 7) -> dict[str, Any]:
    """What long levels with short stability windows produce: many small, mostly distinct records."""
    rng = random.Random(seed)
    return {
        "results": [
            {
                "concurrency": level + 1, "throughputRps": 100.0 + level, "requests": 1000, "errors": 0,
                "windowStart": 1.7e9, "windowEnd": 1.7e9 + windows * 0.05, "latencyMs": {"p99": 12.5},
                "stability": {
                    "windows": [
                        {
                            "start": round(1.7e9 + i * 0.001, 3),
                            "throughputRps": round(rng.uniform(0, 900), 3),
                            "p99Ms": round(rng.uniform(1, 80), 3),
                        }
                        for i in range(windows)
                    ]
                },
            }
            for level in range(levels)
        ]
    }  # fmt: skip


def stored(writes: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The ConfigMaps as the API server would hold them after the writes."""
    return {name: {"metadata": {"name": name}, **content} for name, content in writes}


def gzip_head(packed: bytes, parts: int = 1) -> dict[str, Any]:
    """A results ConfigMap holding `packed` as its gzip part, with a matching sha256."""
    return {
        "metadata": {"name": "x-results"},
        "data": {"parts": str(parts), "sha256": hashlib.sha256(packed).hexdigest()},
        "binaryData": {"results.json.gz": base64.b64encode(packed).decode()},
    }


def test_a_small_document_is_plain_json_under_the_documented_key() -> None:
    document = windows_document(2, 10)
    writes = encode_results("x-results", document)
    assert [name for name, _ in writes] == ["x-results"]
    assert json.loads(writes[0][1]["data"]["results.json"]) == document
    maps = stored(writes)
    assert to_json(decode_results(maps["x-results"], maps.get)) == document


def test_a_document_of_several_mib_is_split_into_parts_and_read_back_exactly() -> None:
    document = windows_document(4, 25_000)
    size = len(json.dumps(document, separators=(",", ":")))
    assert size > 5 * 2**20  # several MiB: far beyond one object's 1 MiB
    writes = encode_results("x-results", document)
    names = [name for name, _ in writes]
    assert len(names) >= 2 and names[-1] == "x-results"  # the head names its parts only once they are written
    assert names[:-1] == [f"x-results-part-{i}" for i in range(1, len(names))]
    for _, content in writes:  # every ConfigMap stays within the API's limit
        encoded = sum(len(v) for v in content.get("binaryData", {}).values())
        assert encoded <= results_sink.INLINE_LIMIT
    maps = stored(writes)
    assert to_json(decode_results(maps["x-results"], maps.get)) == document


def test_the_largest_document_a_legal_spec_makes_is_read_back() -> None:
    """64 rates and 32 peak-search probes, every level cut into as many windows as the spec allows
    (50,000 in all), each window answered, generator verdicts and 20 repeats' figures: real level
    entries, well inside what the operator reads."""
    load = LoadSpec.model_validate(
        {"mode": "open", "rates": [float(r) for r in range(1, 65)], "durationSeconds": 2600,
         "rateSearch": {"minRps": 1, "maxRps": 1000, "maxProbes": 32}, "repeats": 20,
         "stability": {"windowSeconds": 5.0}}
    )  # fmt: skip
    rng = random.Random(1)
    stats = []
    for index in range(96):
        start = 1.7e9 + index * 3000
        samples = [Sample(start + i * 2.5 + rng.random(), rng.uniform(100, 99_999)) for i in range(1040)]
        level = summarise(None, samples)
        gaps = [rng.uniform(0, 50) for _ in range(100)]
        verdict = judge_stability(samples, start, start + load.duration_seconds, load.stability)
        throughputs = [rng.uniform(0, 9e5) for _ in range(20)]
        p99s = [rng.uniform(0, 9e5) for _ in range(20)]
        repeats = Repeats(runs=20, throughput_rps=throughputs, p99_ms=p99s,
                          throughput_rps_mean=mean_ci95(throughputs), p99_ms_mean=mean_ci95(p99s))  # fmt: skip
        open_loop = OpenLoopFigures(offered_rps=1.0, sent_rps=1.0, late_sends=1, dropped_sends=0)
        generator = generator_verdict(99.9, gaps, GeneratorLimits())
        stats.append(dataclasses.replace(level, rate_rps=123456.789, stability=verdict, repeats=repeats,
                                         generator=generator, open_loop=open_loop))  # fmt: skip
    server = ServerBreakdown.model_validate(
        {key: 123456.789 for key in ("queueMsMean", "serverLatencyMsMean", "inferenceMsPerBatch", "meanBatchSize")}
    )
    levels = level_results(stats, 64, dict.fromkeys(range(96), server), 1.0)
    document = {"serverAnsweredAt": 1.7e9, "results": [to_json(level) for level in levels]}
    assert sum(len(entry["stability"]["windows"]) for entry in document["results"]) == 96 * 520
    size = len(json.dumps(document, separators=(",", ":")))
    assert size < MAX_DOCUMENT_BYTES * 0.75, size  # room to spare
    maps = stored(encode_results("x-results", document))
    assert to_json(decode_results(maps["x-results"], maps.get)) == json.loads(json.dumps(document))


def test_a_missing_or_corrupt_part_is_reported_not_misread() -> None:
    writes = encode_results("x-results", windows_document(4, 25_000))
    maps = stored(writes)
    missing = {name: cm for name, cm in maps.items() if name != "x-results-part-1"}
    with pytest.raises(ResultsMissing, match="part 1 \\(x-results-part-1\\) is missing"):
        decode_results(maps["x-results"], missing.get)
    part = maps["x-results-part-1"]["binaryData"]
    part["results.json.gz"] = base64.b64encode(b"\0" * 100).decode()
    with pytest.raises(ResultsUnreadable, match="do not match its sha256"):
        decode_results(maps["x-results"], maps.get)
    with pytest.raises(ResultsUnreadable, match="x-results: not gzip data"):
        decode_results(gzip_head(b"not gzip at all"), lambda name: None)


def test_an_empty_results_configmap_holds_no_results_yet() -> None:
    with pytest.raises(ResultsMissing, match="holds no results yet"):
        decode_results({"metadata": {"name": "x-results"}, "data": {}}, lambda name: None)
    with pytest.raises(ResultsMissing, match="does not exist"):
        decode_results(None, lambda name: None)


def test_a_document_beyond_every_part_is_refused_with_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results_sink, "MAX_PARTS", 1)
    with pytest.raises(SinkError, match="MiB gzipped; at most"):
        encode_results("x-results", windows_document(4, 25_000))


def test_the_writer_refuses_a_document_the_operator_would_not_read() -> None:
    with pytest.raises(SinkError, match=r"9\.\d MiB of JSON; the operator reads at most 8 MiB"):
        encode_results("x-results", windows_document(4, 38_000))


@pytest.mark.parametrize("claimed", ["1000000", "33", "0", "-1", "lots"])
def test_a_head_claiming_too_many_parts_is_refused_before_any_part_is_read(claimed: str) -> None:
    head = gzip_head(gzip.compress(b'{"results": []}'), parts=1)
    head["data"]["parts"] = claimed
    asked: list[str] = []
    with pytest.raises(ResultsUnreadable, match=f"x-results claims '{claimed}' parts; a document has 1 to 32"):
        decode_results(head, asked.append)
    assert asked == []


def test_a_body_inflating_to_200_mb_is_refused_at_the_cap_without_inflating_it() -> None:
    packer = zlib.compressobj(9, wbits=16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    packed = b"".join(packer.compress(zeros) for _ in range(200)) + packer.flush()
    assert len(packed) < results_sink.PART_BYTES  # 200 MiB of zeros fit in one part
    head = gzip_head(packed)
    tracemalloc.start()
    try:
        with pytest.raises(ResultsUnreadable, match="inflate to more than 8 MiB of JSON"):
            decode_results(head, lambda name: None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_DOCUMENT_BYTES  # the cap, its growth, one part: never the 200 MiB


def test_the_same_bomb_spread_over_parts_is_refused_at_the_cap() -> None:
    packed = gzip.compress(bytes(50 << 20), 9)
    chunks = [packed[i : i + 4096] for i in range(0, len(packed), 4096)]
    assert 1 < len(chunks) <= results_sink.MAX_PARTS
    head = gzip_head(packed, parts=len(chunks))
    head["binaryData"]["results.json.gz"] = base64.b64encode(chunks[0]).decode()
    parts = {f"x-results-part-{i}": {"binaryData": {"results.json.gz": base64.b64encode(c).decode()}}
             for i, c in enumerate(chunks[1:], start=1)}  # fmt: skip
    with pytest.raises(ResultsUnreadable, match=r"more than 8 MiB of JSON \(read up to x-results-part-\d+\)"):
        decode_results(head, parts.get)


def test_a_part_larger_than_any_written_one_is_refused() -> None:
    head = gzip_head(b"")
    head["binaryData"]["results.json.gz"] = "A" * (results_sink.INLINE_LIMIT + 4)
    with pytest.raises(ResultsUnreadable, match="a part holds at most 921600"):
        decode_results(head, lambda name: None)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[" + "[]," * 300_000 + "[]]", "up to 600002 JSON values; at most 600000"),
        ('{"results": [], "x": [' + "1," * 700_000 + "1]}", "up to 700004 JSON values; at most 600000"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
        ('{"results": {}}', "not a results document: results: {}: Input should be a valid array"),
        (
            '{"results": [{"throughputRps": "' + "9" * 1000 + '"}]}',
            r"results\[0\].throughputRps: \"'9+\.\.\. \(str\)\": Input should be a valid number",
        ),
        ('{"results": [], "ceiling": {"x": "' + "y" * 20_000 + '"}}', "ceiling: more than 16384 bytes"),
        (
            '{"results": [' + ",".join(['{"throughputRps": 1, "requests": 1, "errors": 0}'] * 129) + "]}",
            r"results: \"\[\{.*\.\.\. \(list\)\" has 129 items; list should have at most 128 items",
        ),
    ],
    ids=["brackets", "commas", "nesting", "no-levels", "not-a-number", "large-ceiling", "levels"],
)
def test_a_document_that_would_cost_much_to_parse_or_is_not_results_is_refused(text: str, problem: str) -> None:
    heads = [gzip_head(gzip.compress(text.encode()))]
    if len(text) <= results_sink.INLINE_LIMIT:  # stored plain, as a small document is
        heads.append({"metadata": {"name": "x-results"}, "data": {"results.json": text}})
    for head in heads:
        with pytest.raises(ResultsUnreadable, match=problem):
            decode_results(head, lambda name: None)


def test_trailing_bytes_after_the_gzip_stream_are_refused() -> None:
    packed = gzip.compress(json.dumps(windows_document(1, 3)).encode()) + b"more"
    with pytest.raises(ResultsUnreadable, match="truncated or followed by other bytes"):
        decode_results(gzip_head(packed), lambda name: None)


def test_a_levels_percentile_bounds_are_read_and_must_be_numbers() -> None:
    bounds: dict[str, object] = {"lower": 9.1, "upper": 9.9, "confidence": 0.95, "samples": 400}
    level = {"throughputRps": 9.0, "requests": 400, "errors": 0, "windowStart": 1.0, "windowEnd": 2.0,
             "latencyMs": {"p99": 9.5, "intervals": {"p99": bounds}}}  # fmt: skip

    def stored() -> dict[str, object]:
        return {"metadata": {"name": "x-results"}, "data": {"results.json": json.dumps({"results": [level]})}}

    bound = decode_results(stored(), lambda name: None).results[0].latency_ms.p99_interval
    assert bound is not None and bound.upper == 9.9
    bounds["upper"] = "9.9"
    with pytest.raises(ResultsUnreadable, match=r"results\[0\].latencyMs.intervals.p99.upper: '9.9': Input should"):
        decode_results(stored(), lambda name: None)


@pytest.mark.parametrize(
    ("level", "problem"),
    [
        (
            {"stability": {"windows": [{"start": "soon", "throughputRps": 1.0}]}},
            "results[0].stability.windows[0].start: 'soon': Input should be a valid number",
        ),
        ({"generator": {"saturated": "no"}}, "results[0].generator.saturated: 'no': Input should be a valid boolean"),
        ({"errorsByKind": {"http_503": 2.5}}, "results[0].errorsByKind.http_503: 2.5: Input should be a valid integer"),
        ({"requests": True}, "results[0].requests: True: Input should be a valid integer"),
        (
            {"phases": [{"name": "step 1", "requests": 1, "errors": 0, "throughputRps": 1.0}]},
            "results[0].phases[0].seconds: required field is missing",
        ),
    ],
    ids=["window-start", "saturated", "error-count", "bool-count", "phase"],
)
def test_a_document_is_read_once_into_its_model_and_any_field_it_gets_wrong_is_named(
    level: dict[str, Any], problem: str
) -> None:
    good = {"throughputRps": 9.0, "requests": 400, "errors": 0, "windowStart": 1.0, "windowEnd": 2.0}

    def stored(entry: dict[str, Any]) -> dict[str, object]:
        return {"metadata": {"name": "x-results"}, "data": {"results.json": json.dumps({"results": [entry]})}}

    assert decode_results(stored(good), lambda name: None).results[0].requests == 400  # the typed document
    with pytest.raises(ResultsUnreadable) as refused:
        decode_results(stored({**good, **level}), lambda name: None)
    assert str(refused.value) == f"x-results: not a results document: {problem}"
