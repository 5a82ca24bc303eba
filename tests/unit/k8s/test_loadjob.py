"""The load Job the operator creates. Its deadline covers what the spec plans: every run of every level
(warm-ups, stability extensions, repeats, the rate search's probes) or a shape's whole schedule, the pod's
start and the wait for the server, and the results write with its retries (the first rows are the issue's,
whose deadline was 300 s, 300 s and 690 s). Its pods ask for requests and limits: the experiment's, else
the operator's (the chart's loadJob.resources)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from servinglab.api import parse_experiment
from servinglab.k8s import builders, loadbuilders
from servinglab.k8s.deadline import POD_START_SECONDS, load_job_deadline
from servinglab.k8s.podutilisation import READING_SECONDS
from servinglab.k8s.settings import LOAD_RESOURCES, Settings
from servinglab.k8s.sink import WRITE_SECONDS
from servinglab.loadgen.planned import planned_load
from servinglab.servers import get
from servinglab.servers.base import PodInputs
from support.manifests import experiment
from support.paths import ROOT

BURST = {"baseRps": 10, "burstRps": 50, "burstSeconds": 10, "periodSeconds": 60}
SEARCH = {"minRps": 10, "maxRps": 100, "maxProbes": 8}
# defaults: warm-up 10 s, 60 s measured, request timeout 60 s (stragglers), server start-up timeout 600 s
RUN = 10 + 60 + 60
START = POD_START_SECONDS + 600


def spec(load: dict[str, Any], server: dict[str, Any] | None = None, slo: bool = False) -> Any:
    document = experiment("demo", load=load, server=server or {}, slo={"p99LatencyMs": 100} if slo else None)
    return parse_experiment(document).spec


@pytest.mark.parametrize(
    ("case", "load", "runs", "load_seconds"),
    [
        ("open-loop burst, 1800 s", {"mode": "open", "shape": {"burst": {**BURST, "durationSeconds": 1800}}},
         1, 10 + 1800 + 60),
        ("open-loop step, 10 x 120 s", {"mode": "open", "shape": {"step": {"rates": list(range(10, 110, 10)),
                                                                           "stepSeconds": 120}}},
         1, 10 + 1200 + 60),
        ("repeats 20 at the default levels", {"repeats": 20}, 60, 60 * RUN),
        ("the default levels", {}, 3, 3 * RUN),
        ("closed-loop step of users", {"shape": {"step": {"users": [1, 2, 4], "stepSeconds": 30}}}, 1, 10 + 90 + 60),
        ("trace (its length bounded, not known)", {"mode": "open", "shape": {"trace": {"file": "t.txt"}}},
         1, 10 + 7200 + 60),
        ("stability extended to 300 s", {"stability": {"maxDurationSeconds": 300}}, 3, 3 * (10 + 300 + 60)),
        ("rate search alone", {"mode": "open", "rateSearch": SEARCH}, 8, 8 * RUN),
        ("rates, rate search and repeats", {"mode": "open", "rates": [10, 20], "rateSearch": SEARCH, "repeats": 3},
         30, 30 * RUN),
    ],
)  # fmt: skip
def test_the_deadline_covers_the_planned_load(case: str, load: dict[str, Any], runs: int, load_seconds: int) -> None:
    experiment = spec(load, slo="rateSearch" in load)
    planned = planned_load(experiment.load)
    assert (planned.runs, planned.seconds) == (runs, load_seconds), case
    deadline = load_job_deadline(experiment)
    assert deadline.seconds == START + load_seconds + WRITE_SECONDS, case
    assert deadline.write == WRITE_SECONDS >= 600  # the sink's whole retry window, after the load
    plan = get("torchserve").pod(experiment, PodInputs("demo-config", "servinglab/servinglab:test"))
    job = loadbuilders.load_job(builders.Owner("demo", "ns", "uid"), experiment, plan, "servinglab/servinglab:test")
    assert job["spec"]["activeDeadlineSeconds"] == deadline.seconds


@pytest.mark.parametrize(
    ("aim", "runs"),
    [({"target": 0.6, "maxProbes": 16}, 16), ({"target": 0.6, "maxProbes": 4, "probeSeconds": 20}, 5)],
)
def test_the_deadline_covers_a_utilisation_search_and_each_probes_reading(aim: dict[str, Any], runs: int) -> None:
    """Every probe may run, then wait for Prometheus to scrape past its window and answer; with probeSeconds
    the load found is measured once more. A deadline short of that ends the search as LoadJobFailed, not as
    the answer it would have given."""
    experiment = spec({"mode": "closed", "utilisationTarget": aim})
    assert planned_load(experiment.load).runs == runs
    deadline = load_job_deadline(experiment)
    assert deadline.load == runs * (RUN + READING_SECONDS)
    assert READING_SECONDS >= 60  # the wait for a scrape past the window, at the least


def test_the_issues_rows_now_leave_the_load_its_time() -> None:
    """Before: 300 s for a burst of 1800 s, 300 s for a step of 1200 s, 690 s for about 4200 s of load."""
    rows = [
        ({"mode": "open", "shape": {"burst": {**BURST, "durationSeconds": 1800}}}, 1800),
        ({"mode": "open", "shape": {"step": {"rates": list(range(10, 110, 10)), "stepSeconds": 120}}}, 1200),
        ({"repeats": 20}, 20 * 3 * (10 + 60)),
    ]
    for load, asked in rows:
        deadline = load_job_deadline(spec(load)).seconds
        assert deadline >= asked + START + WRITE_SECONDS, (load, deadline)


def test_a_slow_start_and_several_generators_are_allowed_for() -> None:
    quick = load_job_deadline(spec({}, {"startupTimeoutSeconds": 60})).seconds
    assert quick == POD_START_SECONDS + 60 + 3 * RUN + WRITE_SECONDS
    several = load_job_deadline(spec({"generators": 2})).seconds
    assert several == load_job_deadline(spec({})).seconds + 120  # the others join the first


def resources_of(job: dict[str, Any]) -> Any:
    return job["spec"]["template"]["spec"]["containers"][0].get("resources")


def test_load_pods_ask_for_the_experiments_resources_else_the_operators(monkeypatch: pytest.MonkeyPatch) -> None:
    owner, image = builders.Owner("demo", "ns", "uid"), "servinglab/servinglab:test"
    plain = spec({})
    plan = get("torchserve").pod(plain, PodInputs("demo-config", image))
    monkeypatch.delenv("SERVINGLAB_LOAD_RESOURCES", raising=False)
    default = Settings.from_env().load_resources
    assert resources_of(loadbuilders.load_job(owner, plain, plan, image, resources=default)) == {
        "requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "4Gi"}
    }  # fmt: skip
    monkeypatch.setenv("SERVINGLAB_LOAD_RESOURCES", '{"requests": {"cpu": "250m"}, "limits": {"cpu": "500m"}}')
    chosen = Settings.from_env().load_resources
    assert resources_of(loadbuilders.load_job(owner, plain, plan, image, resources=chosen)) == {
        "requests": {"cpu": "250m"}, "limits": {"cpu": "500m"}
    }  # fmt: skip
    own = spec({"resources": {"requests": {"memory": "8Gi"}, "limits": {"memory": "8Gi"}}})
    assert resources_of(loadbuilders.load_job(owner, own, plan, image, resources=chosen)) == {
        "requests": {"memory": "8Gi"}, "limits": {"memory": "8Gi"}
    }  # fmt: skip


@pytest.mark.parametrize(
    ("value", "named"),
    [("{not json", "SERVINGLAB_LOAD_RESOURCES"), ('{"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}',
     "requests.cpu '2' is above limits.cpu '1'"), ('{"requests": {"gpu": "1"}}', "'gpu' is not one of")],
)  # fmt: skip
def test_bad_load_resources_stop_the_operator_at_start(monkeypatch: pytest.MonkeyPatch, value: str, named: str) -> None:
    monkeypatch.setenv("SERVINGLAB_LOAD_RESOURCES", value)
    with pytest.raises(ValueError) as refused:
        Settings.from_env()
    assert named in str(refused.value)


def test_the_charts_default_is_the_operators() -> None:
    values = yaml.safe_load((ROOT / "charts/serving/values.yaml").read_text())
    assert values["loadJob"]["resources"] == LOAD_RESOURCES.manifest()
