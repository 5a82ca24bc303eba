"""The results document survives whatever its size: stored whole, gzipped, or in parts, and read back exactly."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest

from servinglab.k8s import sink as results_sink
from servinglab.k8s.sink import ResultsUnreadable, SinkError, decode_results, encode_results


def windows_document(levels: int, windows: int, seed: int = 7) -> dict[str, Any]:
    """What long levels with short stability windows produce: many small, mostly distinct records."""
    rng = random.Random(seed)
    return {
        "results": [
            {
                "concurrency": level + 1,
                "throughputRps": 100.0 + level,
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
            }  # fmt: skip
            for level in range(levels)
        ]
    }


def stored(writes: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The ConfigMaps as the API server would hold them after the writes."""
    return {name: {"metadata": {"name": name}, **content} for name, content in writes}


def test_a_small_document_is_plain_json_under_the_documented_key() -> None:
    document = windows_document(2, 10)
    writes = encode_results("x-results", document)
    assert [name for name, _ in writes] == ["x-results"]
    assert json.loads(writes[0][1]["data"]["results.json"]) == document
    maps = stored(writes)
    assert decode_results(maps["x-results"], maps.get) == document


def test_a_document_of_several_mib_is_split_into_parts_and_read_back_exactly() -> None:
    document = windows_document(4, 40_000)
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
    assert decode_results(maps["x-results"], maps.get) == document


def test_a_missing_or_corrupt_part_is_reported_not_misread() -> None:
    writes = encode_results("x-results", windows_document(4, 40_000))
    maps = stored(writes)
    missing = {name: cm for name, cm in maps.items() if name != "x-results-part-1"}
    with pytest.raises(ResultsUnreadable, match="part 1 \\(x-results-part-1\\) is missing"):
        decode_results(maps["x-results"], missing.get)
    part = maps["x-results-part-1"]["binaryData"]
    part["results.json.gz"] = base64.b64encode(b"\0" * 100).decode()
    with pytest.raises(ResultsUnreadable, match="do not match its sha256"):
        decode_results(maps["x-results"], maps.get)


def test_an_empty_results_configmap_holds_no_results_yet() -> None:
    with pytest.raises(ResultsUnreadable, match="holds no results yet"):
        decode_results({"metadata": {"name": "x-results"}, "data": {}}, lambda name: None)
    with pytest.raises(ResultsUnreadable, match="does not exist"):
        decode_results(None, lambda name: None)


def test_a_document_beyond_every_part_is_refused_with_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results_sink, "MAX_PARTS", 1)
    with pytest.raises(SinkError, match="MiB gzipped; at most"):
        encode_results("x-results", windows_document(4, 40_000))
