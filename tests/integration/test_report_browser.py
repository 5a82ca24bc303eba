"""The experiment report and the sweep report in a real headless browser (Debian's `chromium`): every
image loads, the page carries its headline sections, and a screenshot of each is kept for CI
(`ci-artifacts/`, git-ignored, listed by `.ci/run`).

The documents are real runs' (tests/fixtures/v0.1.0: the smoke experiment and the smoke sweep), the
experiment's with the tiny model's bytes counted now, so its roofline has points. The pages are rendered by
the command line, as users do, and opened as files, as users open them; a copy of each page carries a
small script that writes, once the page has loaded, every image's natural width into the DOM that
`--dump-dom` prints.
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from servinglab.api.results import to_json
from servinglab.api.trials import SweepPoint
from servinglab.models.counting import builtin_counts
from servinglab.sweep import fronts

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "v0.1.0"
ARTIFACTS = ROOT / "ci-artifacts"
_PROBE = (
    '<script>window.addEventListener("load", () => document.body.setAttribute("data-images", JSON.stringify('
    '[...document.images].map(i => [i.getAttribute("src"), i.complete, i.naturalWidth]))));</script>'
)


@pytest.fixture(scope="module")
def chromium() -> list[str]:
    """The browser and the flags a headless run as any user (root in CI) needs; a private profile."""
    found = shutil.which("chromium")
    assert found is not None, "Debian's chromium is needed (apt-get install chromium; .ci/run installs it)"
    profile = tempfile.mkdtemp(prefix="servinglab-chromium-")
    yield [found, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
           "--virtual-time-budget=15000"]  # fmt: skip
    shutil.rmtree(profile, ignore_errors=True)


def render(servinglab_cmd: list[str], document: dict[str, Any], folder: Path) -> Path:
    source = folder / "results.json"
    source.write_text(json.dumps(document))
    subprocess.run([*servinglab_cmd, "report", str(source)], check=True, capture_output=True, timeout=180)
    return folder / "results" / "index.html"


def opened(chromium: list[str], page: Path, screenshot: str) -> str:
    """The page's DOM after it loaded (with every image's natural width in `data-images`); a screenshot kept."""
    checked = page.with_name("checked.html")
    checked.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))
    dom = subprocess.run([*chromium, "--dump-dom", checked.as_uri()], capture_output=True, text=True, check=True,
                         timeout=120).stdout  # fmt: skip
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / screenshot
    shot.unlink(missing_ok=True)
    subprocess.run([*chromium, "--hide-scrollbars", "--window-size=1400,3000", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, check=True, timeout=120)  # fmt: skip
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return dom


def images_of(dom: str) -> list[tuple[str, bool, int]]:
    start = dom.index('data-images="') + len('data-images="')
    return [tuple(entry) for entry in json.loads(html.unescape(dom[start : dom.index('"', start)]))]


def assert_every_image_loads(dom: str, expected: set[str]) -> None:
    images = images_of(dom)
    assert {src for src, _, _ in images} == expected
    broken = [src for src, complete, width in images if not complete or width <= 0]
    assert not broken, f"images that did not load: {broken}"


def assert_names_the_verdict(dom: str) -> None:
    assert dom.count('id="verdict"') == 1, "the page does not name the verdict"
    assert any(name in dom for name in ("-bound", "near-raw-ceiling", "underloaded", "unknown")), "no verdict named"


def test_the_experiment_report_loads_every_image_in_a_browser(
    chromium: list[str], servinglab_cmd: list[str], tmp_path: Path
) -> None:
    document = json.loads((FIXTURES / "results-smoke.json").read_text())
    counts = builtin_counts("tiny")
    document["modelInfo"] = {"name": "tiny", "weightBytes": counts["weightBytes"],
                             "activationBytes": counts["activationBytes"]}  # fmt: skip
    dom = opened(chromium, render(servinglab_cmd, document, tmp_path), "report-experiment.png")
    assert_every_image_loads(dom, {"latency-cdf.png", "throughput-p99.png", "server-breakdown.png",
                                   "timeseries.png", "roofline.png"})  # fmt: skip
    assert "<h1>tiny-smoke: tiny</h1>" in dom and "<th>p99 ms</th>" in dom
    assert "Best level:" in dom and "Ceiling: 0.00324 GFLOPs per inference" in dom
    assert "Roofline: " in dom and "FLOPs per byte at the served batch 8 (fp32)" in dom
    assert_names_the_verdict(dom)


def priced(document: dict[str, Any]) -> dict[str, Any]:
    """The sweep as if its template had a price: each point's cost per million (a price of 1 per hour), p99
    bounds on every other point, and the cost front over them."""
    points = [SweepPoint.model_validate(point) for point in document["points"]]
    points = [point.model_copy(update={"cost_per_million": round(1e6 / (point.throughput_rps * 3600), 4),
                                       "p99_upper_ms": point.p99_latency_ms * 1.2 if index % 2 else None})
              for index, point in enumerate(points)]  # fmt: skip
    front, _ = fronts.cost_front(points)
    return {**document, "points": [to_json(point) for point in points], "costFront": [to_json(p) for p in front or []]}


@pytest.mark.parametrize("price", ["unpriced", "priced"])
def test_the_sweep_report_loads_every_image_in_a_browser(
    chromium: list[str], servinglab_cmd: list[str], tmp_path: Path, price: str
) -> None:
    document = json.loads((FIXTURES / "sweep.json").read_text())
    document = priced(document) if price == "priced" else document
    # a v0.1.0 sweep had no verdicts: its best trial gets the one a current sweep carries
    document["best"]["verdict"] = {
        "bottleneck": "queue-bound",
        "because": "requests wait for a free worker",
        "next": "more workers",
        "hints": [{"axis": "workers", "step": 1}],
    }
    dom = opened(
        chromium,
        render(servinglab_cmd, document, tmp_path),
        "report-sweep.png" if price == "unpriced" else "report-sweep-priced.png",
    )
    assert_every_image_loads(dom, {"pareto.png", "capacity.png", "cost_front.png"})
    if price == "priced":  # the cost front's table: one row per point, each p99 with its interval marker
        table = dom[dom.index('<table id="cost-front">') :]
        table = table[: table.index("</table>")]
        assert table.count("<tr>") == 1 + len(document["costFront"])
        for point in document["costFront"]:
            marker = " [" if "p99UpperMs" in point else " (no bound)"
            assert point["trial"] in table and f"{point['p99LatencyMs']:.1f}{marker}" in table
    else:
        assert '<p id="cost-front">No cost front:' in dom
    assert "<h1>Sweep tiny-sweep: tiny</h1>" in dom and "<b>Best within the SLO</b>:" in dom
    assert "Stopped:" in dom and "<th>data path</th>" in dom
    assert_names_the_verdict(dom)
    assert "<b>queue-bound</b>" in dom, "the best trial's verdict"
