"""Credentials never land in a ConfigMap: a URL naming a user is refused (naming the field, saying where
credentials go), a Prometheus URL takes no query string, and a pre-signed model URL's query reaches the
model init container from a per-experiment Secret while the experiment's ConfigMap holds it redacted.
`servinglab prepare-model` then fetches the whole URL from a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from click.testing import CliRunner

from servinglab import servers
from servinglab.api import SpecError, parse_experiment
from servinglab.cli import main
from servinglab.k8s import builders, modelsecrets
from servinglab.k8s.experiment import snapshot
from servinglab.models.fetch import MODEL_URL_ENV, MODEL_URL_KEY
from servinglab.servers.base import PodInputs
from support import manifests
from usermodels import file_server

SIGNATURE = "X-Amz-Signature=0a1b2c3d4e5f"
PRESIGNED = f"https://models.example/bucket/m.pt?X-Amz-Credential=AKIAEXAMPLE&{SIGNATURE}"
OWNER = builders.Owner("presigned", "bench", "uid-1")


def experiment(model: dict[str, Any], server: str = "torchserve", **spec: Any) -> dict[str, Any]:
    return manifests.experiment("presigned", model=model, server={"kind": server}, **spec)


def problems(document: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_experiment(document)
    return info.value.problems


@pytest.mark.parametrize(
    ("document", "field"),
    [
        (experiment({"name": "m", "source": {"url": "https://alice:hunter2@models.example/m.pt"}}),
         "spec.model.source: url: 'https://models.example/m.pt' carries credentials"),
        (experiment({"name": "tiny"}, metrics={"prometheusUrl": "http://alice:hunter2@prom.example:9090"}),
         "spec.metrics.prometheusUrl: 'http://prom.example:9090' carries credentials"),
    ],
)  # fmt: skip
def test_a_url_naming_a_user_is_refused_naming_the_field_not_the_password(document: dict[str, Any], field: str) -> None:
    found = problems(document)
    assert any(problem.startswith(field) for problem in found), found
    assert not any("hunter2" in problem for problem in found)
    said = " ".join(found)
    assert "authorizationSecret" in said if "model" in field else "prometheusAuthorizationSecret" in said


def test_a_prometheus_url_with_a_query_string_is_refused() -> None:
    found = problems(experiment({"name": "tiny"}, metrics={"prometheusUrl": "https://prom.example/?token=abc"}))
    assert any(
        p.startswith("spec.metrics.prometheusUrl: 'https://prom.example/?<redacted>' has a query") for p in found
    )
    assert not any("token=abc" in p for p in found)


def presigned_spec(server: str = "torchserve") -> Any:
    return parse_experiment(experiment({"name": "m", "source": {"url": PRESIGNED}}, server)).spec


@pytest.mark.parametrize("server", ["torchserve", "litserve"])
def test_no_configmap_the_operator_builds_holds_the_query_string_or_userinfo(server: str) -> None:
    spec = presigned_spec(server)
    assert modelsecrets.needs_model_url_secret(spec)
    plan = servers.get(server).pod(spec, PodInputs("presigned-config", "servinglab:1", model_url_secret="s-abcde"))
    config_maps = [
        builders.config_map(OWNER, plan, snapshot.document(OWNER.name, spec)),
        builders.results_config_map(OWNER),
    ]
    for config_map in config_maps:
        text = json.dumps(config_map)
        assert SIGNATURE not in text and "AKIAEXAMPLE" not in text
    kept = snapshot.parse(config_maps[0]["data"][builders.EXPERIMENT_FILE], "ConfigMap")
    assert kept.model.source is not None and kept.model.source.url == "https://models.example/bucket/m.pt?<redacted>"
    # what the init container gets: the whole URL from the Secret, and only it
    pod = builders.deployment(OWNER, spec, plan)["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    assert {"name": MODEL_URL_ENV, "valueFrom": {"secretKeyRef": {"name": "s-abcde", "key": MODEL_URL_KEY}}} in init[
        "env"
    ]
    assert not any(MODEL_URL_ENV in json.dumps(c) for c in [*pod["containers"], *pod["initContainers"][1:]])
    assert SIGNATURE not in json.dumps(pod)
    secret = modelsecrets.model_url_secret(OWNER, PRESIGNED)
    assert secret["metadata"]["generateName"] == "presigned-server-model-url-" and secret["immutable"] is True
    assert base64.b64decode(secret["data"][MODEL_URL_KEY]).decode() == PRESIGNED
    assert kept.model.source.with_url(PRESIGNED).url == PRESIGNED


def test_a_url_without_a_query_needs_no_secret() -> None:
    plain = parse_experiment(experiment({"name": "m", "source": {"url": "https://models.example/m.pt"}})).spec
    assert not modelsecrets.needs_model_url_secret(plain)
    assert snapshot.document("x", plain)["spec"]["model"]["source"]["url"] == "https://models.example/m.pt"


def test_the_whole_url_must_be_the_one_the_configmap_redacted() -> None:
    kept = snapshot.parse(yaml.safe_dump(snapshot.document(OWNER.name, presigned_spec())), "ConfigMap").model.source
    assert kept is not None
    with pytest.raises(ValueError, match="is not this source's url"):
        kept.with_url("https://elsewhere.example/bucket/m.pt?" + SIGNATURE)


def test_prepare_model_fetches_the_whole_url_from_the_secret_s_variable(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    torch.jit.save(torch.jit.script(torch.nn.Linear(4, 2)), str(served / "m.pt"))
    with file_server(served) as server:
        whole = f"{server.url}/m.pt?{SIGNATURE}"
        model = {"name": "m", "source": {"url": whole}, "input": {"kind": "tensor", "shape": [4]}}
        spec = parse_experiment(experiment(model)).spec
        spec_file = tmp_path / "experiment.yaml"
        spec_file.write_text(yaml.safe_dump(snapshot.document("presigned", spec)))
        assert SIGNATURE not in spec_file.read_text()
        args = ["prepare-model", "--spec-file", str(spec_file), "--into", str(tmp_path / "store" / "m"), "--no-count",
                "--termination-log", str(tmp_path / "termination-log")]  # fmt: skip
        result = CliRunner().invoke(main, args, env={MODEL_URL_ENV: whole})
        assert result.exit_code == 0, result.output
    assert server.requests == [f"/m.pt?{SIGNATURE}"]
