"""The Grafana dashboards shipped in charts/serving: what a Grafana user relies on besides the queries
(those are evaluated against a real Prometheus in tests/k8s/test_chart.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from support.paths import ROOT

DASHBOARDS = sorted((ROOT / "charts" / "serving" / "dashboards").glob("*.json"))


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def test_the_dashboards_ship() -> None:
    assert [path.stem for path in DASHBOARDS] == ["experiments", "gpu", "litserve", "torchserve", "triton"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=[path.stem for path in DASHBOARDS])
def test_dashboard_has_a_stable_uid_a_datasource_variable_and_units(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] == f"servinglab-{path.stem}"  # links and provisioning keep working across edits
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}"
            assert variable["includeAll"] and variable["allValue"] == ".*"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["description"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(target["expr"].strip() for target in panel["targets"]), panel["title"]
        assert all(target["datasource"]["uid"] == "${datasource}" for target in panel["targets"])


def test_dashboards_cover_what_the_issue_names() -> None:
    titles = {path.stem: {panel["title"] for panel in panels(json.loads(path.read_text()))} for path in DASHBOARDS}
    assert {"Request rate", "Mean latency (server)", "Mean queue time", "Responses by class", "Workers"} <= titles[
        "torchserve"
    ]
    assert {
        "Request rate",
        "Mean latency (server)",
        "Mean queue time",
        "Responses by class",
        "Workers",
        "Mean batch size",
        "Handler time per batch",
        "Max batch size",
        "Batch timeout",
    } <= titles["litserve"]
    assert {"GPU utilisation", "SM activity", "Framebuffer memory used", "Power", "Energy in the time range"} <= titles[
        "gpu"
    ]
    assert {"GPU utilisation by pod", "Memory by pod", "Power by pod"} <= titles["gpu"]
    assert {"Request rate", "Mean latency (server)", "Mean queue time", "Compute time per request",
            "Mean batch size", "Failures by reason"} <= titles["triton"]  # fmt: skip
    assert {"Best configuration", "Throughput and p99 by configuration and level"} <= titles["experiments"]
    assert "Verdict by configuration and level" in titles["experiments"]  # why each level got what it did
    assert "Experiments finished by state" in titles["experiments"]
    # the sweep view: trials, best configuration, front
    assert {"Sweep trials by state", "Best configuration per sweep", "Pareto front: throughput against p99"} <= titles[
        "experiments"
    ]


def operator_metric_names() -> set[str]:
    """The series names the operator exports (a counter's with its `_total`), from its registry."""
    from prometheus_client import REGISTRY

    import servinglab.k8s.metrics  # noqa: F401 - registers the operator's metrics

    names = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def test_every_metric_the_experiments_dashboard_names_is_one_the_operator_exports() -> None:
    """A panel that names a metric the operator does not export shows nothing, silently: refused here (the
    queries' data is checked against a real run in tests/k8s/test_chart.py, which needs a cluster). The
    experiments dashboard is the operator's; the servers' dashboards name the servers' own metrics."""
    known = operator_metric_names()
    dashboard = json.loads((DASHBOARDS[0].parent / "experiments.json").read_text())
    queries = [(panel["title"], target["expr"]) for panel in panels(dashboard) for target in panel["targets"]]
    queries += [("variable " + v["name"], v["query"]["query"]) for v in dashboard["templating"]["list"]
                if v["type"] == "query"]  # fmt: skip
    unknown = [(title, name) for title, expr in queries for name in re.findall(r"\bservinglab_\w+", expr)
               if name not in known]  # fmt: skip
    assert not unknown


def test_the_experiments_dashboard_shows_cost_and_the_p99_interval() -> None:
    dashboard = json.loads((DASHBOARDS[0].parent / "experiments.json").read_text())
    exprs = {panel["title"]: " ".join(t["expr"] for t in panel["targets"]) for panel in panels(dashboard)}
    assert "servinglab_experiment_cost_per_million" in exprs["Cost per million inferences by configuration and level"]
    interval = exprs["p99 with its 95 % interval by configuration and level"]
    assert all(f"servinglab_experiment_latency_p99{part}_ms" in interval for part in ("_lower", "", "_upper"))
    front = exprs["Cost front: cost per million against p99"]
    assert all(f"servinglab_sweep_cost_front_{name}" in front for name in ("cost_per_million", "p99_bound_ms"))
