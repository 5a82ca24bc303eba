"""What the operator builds for an experiment of several load pods: their key's Secret, their own
NetworkPolicy, and a Job that gets the key from the Secret only (pure builders of k8s/builders.py;
tests/k8s/test_load_coordination.py follows the same objects on the real control plane)."""

from __future__ import annotations

import base64
import json

import pytest

from servinglab import servers
from servinglab.api import ExperimentSpec, load_experiment
from servinglab.k8s import builders as resources
from servinglab.k8s import loadbuilders
from servinglab.loadgen import wire
from servinglab.servers.base import PodInputs, PodPlan
from support.paths import EXAMPLES

HALFP = load_experiment(EXAMPLES / "experiment-halfp.yaml").spec
TWO = HALFP.model_copy(update={"load": HALFP.load.model_copy(update={"generators": 2})})
OWNER = resources.Owner("resnet50-halfp", "bench", "uid-1")


def plan(spec: ExperimentSpec) -> PodPlan:
    return servers.get(spec.server.kind).pod(spec, PodInputs("resnet50-halfp-config", "x"))


def test_the_key_secret_is_named_by_the_api_server_owned_and_immutable() -> None:
    key = wire.new_key()
    secret = loadbuilders.generator_key_secret(OWNER, key)
    assert "name" not in secret["metadata"] and secret["metadata"]["generateName"] == "resnet50-halfp-load-key-"
    assert secret["metadata"]["ownerReferences"] == [resources.owner_reference(OWNER)]
    assert secret["immutable"] is True and secret["type"] == "Opaque"
    text = base64.b64decode(secret["data"][loadbuilders.GENERATOR_KEY_FIELD]).decode()
    assert wire.key_from_text(text) == key  # hex: an env variable from it holds text


def test_a_job_of_several_generators_reads_the_key_from_its_secret_and_nowhere_else() -> None:
    key = wire.new_key()
    job = loadbuilders.load_job(OWNER, TWO, plan(TWO), "x", key_secret="resnet50-halfp-load-key-abcde")
    container = job["spec"]["template"]["spec"]["containers"][0]
    (env,) = [variable for variable in container["env"] if variable["name"] == wire.KEY_ENV]
    assert env["valueFrom"] == {"secretKeyRef": {"name": "resnet50-halfp-load-key-abcde", "key": "key"}}
    assert "value" not in env and key.hex() not in json.dumps(job)
    with pytest.raises(ValueError, match="needs the Secret of their key"):
        loadbuilders.load_job(OWNER, TWO, plan(TWO), "x")
    alone = loadbuilders.load_job(OWNER, HALFP, plan(HALFP), "x")["spec"]["template"]["spec"]["containers"][0]
    assert all(variable["name"] != wire.KEY_ENV for variable in alone["env"])


def test_the_network_policy_admits_the_generators_port_from_this_experiments_load_pods_only() -> None:
    policy = loadbuilders.load_network_policy(OWNER)
    job = loadbuilders.load_job(OWNER, TWO, plan(TWO), "x", key_secret="k")
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    own = {"app.kubernetes.io/component": "load", resources.UID_LABEL: "uid-1"}
    assert spec["podSelector"] == {"matchLabels": own} and own.items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"]  # everything else into load pods is refused
    assert spec["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": own}}], "ports": [{"protocol": "TCP", "port": 7100}]}
    ]
    # a same-named predecessor's or another experiment's load pods are not admitted
    other = loadbuilders.load_network_policy(resources.Owner("resnet50-halfp", "bench", "uid-2"))
    assert other["spec"]["podSelector"] != spec["podSelector"]
    assert policy["metadata"]["ownerReferences"] == [resources.owner_reference(OWNER)]
