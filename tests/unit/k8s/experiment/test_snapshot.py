"""A started experiment's snapshot: the validated spec its ConfigMap keeps, read back after an operator
restart or upgrade instead of the live spec (which a newer CRD may have defaulted new fields into)."""

from __future__ import annotations

import pytest
import yaml

from servinglab import servers
from servinglab.api import ExperimentSpec, SpecError, load_experiment
from servinglab.api.servers import ServerSpec
from servinglab.k8s import builders
from servinglab.k8s.experiment import snapshot
from servinglab.servers.base import PodInputs
from support.paths import EXAMPLES

HALFP = load_experiment(EXAMPLES / "experiment-halfp.yaml").spec
OWNER = builders.Owner("halfp", "bench", "uid-1")


def stored(spec: ExperimentSpec) -> str:
    """experiment.yaml as the reconciler writes it into the experiment's ConfigMap."""
    plan = servers.get(spec.server.kind).pod(spec, PodInputs(builders.Names(OWNER.name).config, "servinglab:0.1.0"))
    manifest = builders.config_map(OWNER, plan, snapshot.document(OWNER.name, spec))
    return str(manifest["data"][builders.EXPERIMENT_FILE])


def test_the_snapshot_reads_back_as_the_spec_it_was_written_from() -> None:
    assert snapshot.parse(stored(HALFP), "ConfigMap bench/halfp-config") == HALFP


def test_a_snapshot_written_before_a_field_existed_runs_with_that_fields_default() -> None:
    document = yaml.safe_load(stored(HALFP))
    del document["spec"]["server"]["jobQueueSize"]  # as an older operator, which knew no such field, wrote it
    spec = snapshot.parse(yaml.safe_dump(document), "ConfigMap bench/halfp-config")
    assert spec.server.job_queue_size == ServerSpec().job_queue_size
    assert spec.model_copy(update={"server": HALFP.server}) == HALFP


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("a: &x [1, 2]\nb: [*x, *x]\n", "aliases are not allowed"),  # expands without bound when nested
        ("spec: [" + "1, " * (snapshot.MAX_SNAPSHOT_CHARS // 3) + "1]\n", "above the limit"),
        ("spec: {model: {name: tiny}\n", "not valid YAML"),
    ],
    ids=["aliases", "oversized", "broken"],
)
def test_an_unreadable_snapshot_is_refused_naming_where_it_is(text: str, named: str) -> None:
    with pytest.raises(SpecError, match=named) as refused:
        snapshot.parse(text, "ConfigMap bench/halfp-config key experiment.yaml")
    assert "ConfigMap bench/halfp-config key experiment.yaml" in str(refused.value)
