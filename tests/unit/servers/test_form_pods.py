"""The model's form (`server.form`) in a server pod (pure manifests and status reading): a built-in's form is
built in the model init container (which alone has the cache claim and key) where each kind serves the model
from, a user's model's in a `form` init container that has no cache, claim or credentials (building it runs
the user's code); the GPU form is checked on the server's GPUs; what ran, and a form that disagrees or
cannot be built, are read from the init containers' termination messages.
(tests/k8s/test_forms_on_cluster.py runs it on the control plane.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from servinglab.api import parse_experiment
from servinglab.k8s.experiment import diagnose
from servinglab.servers import get
from servinglab.servers.base import PodInputs
from support.manifests import experiment

INPUTS = PodInputs("x-config", "servinglab:1", model_cache_claim="models", model_cache_key_secret="servinglab-key")
RUN = {"form": "onnxruntime", "backend": "onnxruntime", "provider": "CPUExecutionProvider", "precision": "fp32",
       "batchSizes": [1, 2, 4], "buildSeconds": 2.5, "cached": False, "cacheKey": "abc",
       "gate": {"maxAbsError": 1e-6, "maxRelError": 1e-7, "tolerance": 1e-3, "passed": True}}  # fmt: skip


def spec_of(kind: str, form: str | None = "onnxruntime", gpus: int = 0, source: bool = False) -> Any:
    model: dict[str, Any] = {"name": "tiny"}
    if source:
        model = {"name": "mine", "input": {"kind": "image", "size": 32},
                 "source": {"url": "https://models.example.com/m.pt", "sha256": "a" * 64}}  # fmt: skip
    server = {"kind": kind, "gpus": gpus, **({"form": form} if form else {})}
    return parse_experiment(experiment("x", model=model, server=server)).spec


FOLDERS = [("litserve", "/models/tiny"), ("torchserve", "/home/model-server/model-store/tiny"),
           ("triton", "/models/tiny/1/build")]  # fmt: skip


@pytest.mark.parametrize(("kind", "folder"), FOLDERS)
def test_a_builtin_s_form_is_built_in_the_model_init_container_where_the_server_loads_it(
    kind: str, folder: str
) -> None:
    plan = get(kind).pod(spec_of(kind), INPUTS)
    (init,) = plan.init_containers
    script = init["args"][0]
    built = next(line for line in script.splitlines() if line.startswith("servinglab prepare-form"))
    assert f"--folder {folder} " in built and "--cache /model-cache/forms --merge" in built
    assert script.index("servinglab build-model") < script.index("servinglab prepare-form")
    assert "resources" not in init  # no GPUs asked for: the form is checked on the CPU
    assert "prepare-form" not in get(kind).pod(spec_of(kind, form=None), INPUTS).init_containers[0]["args"][0]


def test_a_gpu_server_s_form_is_checked_on_its_gpus() -> None:
    (init,) = get("litserve").pod(spec_of("litserve", gpus=2), INPUTS).init_containers
    assert init["resources"] == {"limits": {"nvidia.com/gpu": "2"}}


def test_a_user_model_s_form_is_built_apart_from_the_cache_and_credentials() -> None:
    plan = get("triton").pod(spec_of("triton", source=True, gpus=1), INPUTS)
    model, probe, form = plan.init_containers
    assert (model["name"], probe["name"], form["name"]) == ("model", "probe", "form")
    assert "prepare-form" not in model["args"][0]
    assert form["command"] == ["servinglab", "prepare-form"]
    assert form["args"][form["args"].index("--folder") + 1] == "/models/mine/1/build"
    assert {mount["name"] for mount in form["volumeMounts"]} == {"model-store", "config", "probe-tmp"}
    assert "env" not in form and "servinglab-key" not in json.dumps(form)
    assert form["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert [
        c["name"] for c in get("triton").pod(spec_of("triton", form=None, source=True), INPUTS).init_containers
    ] == ["model", "probe"]


@pytest.mark.parametrize("kind", ["litserve", "torchserve", "triton"])
def test_a_user_model_s_form_has_room_for_its_file_where_it_is_built_and_where_it_is_served(kind: str) -> None:
    """A form file holds the weights: a 3 GiB model's ONNX export needs 3 GiB more in the form container's /tmp
    (1 GiB before, whatever the model: the kubelet evicts a pod whose emptyDir passes its sizeLimit) and beside
    the model in the store."""

    def sizes(form: str | None) -> dict[str, str]:
        model = {
            "name": "big",
            "input": {"kind": "image", "size": 32},
            "source": {"url": "https://models.example.com/m.onnx", "sha256": "a" * 64, "maxBytes": 3 * 2**30},
        }
        server = {"kind": kind, "gpus": 0, **({"form": form} if form else {})}  # fmt: skip
        volumes = get(kind).pod(parse_experiment(experiment("x", model=model, server=server)).spec, INPUTS).volumes
        return {v["name"]: v["emptyDir"]["sizeLimit"] for v in volumes if v["name"] in ("model-store", "probe-tmp")}

    eager = {"model-store": f"{2 * 3 * 1024 + 256}Mi", "probe-tmp": "1024Mi"}
    assert sizes(None) == sizes("eager") == sizes("compile") == eager  # nothing is written as a file
    for form in ("torchscript", "onnxruntime"):
        assert sizes(form) == {"model-store": f"{3 * 3 * 1024 + 256}Mi", "probe-tmp": f"{1024 + 2 * 3 * 1024}Mi"}


def ended(name: str, message: str, code: int = 0) -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, "message": message}}}


def pod(*inits: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "x-server-1"}, "status": {"initContainerStatuses": list(inits)}}


def test_what_ran_is_read_from_the_model_or_the_form_init_container() -> None:
    described = {"name": "tiny", "source": "built-in:tiny", "parameters": 10, "form": RUN}
    builtin = pod(ended("model", json.dumps(described)))
    run = diagnose.form_run(builtin)
    assert run is not None and (run.form, run.provider, run.cache_key, run.gate and run.gate.passed) == (
        "onnxruntime", "CPUExecutionProvider", "abc", True
    )  # fmt: skip
    model = diagnose.model_description(builtin)
    assert model is not None and model.source == "built-in:tiny"
    user = pod(ended("model", json.dumps({"name": "mine"})), ended("probe", "{}"), ended("form", json.dumps(RUN)))
    assert diagnose.form_run(user) == run
    assert diagnose.form_run(pod(ended("model", json.dumps({"name": "tiny"})))) is None


@pytest.mark.parametrize("container", ["model", "form"])
@pytest.mark.parametrize("reason", ["FormDisagrees", "FormNotBuilt", "FormNotSupported"])
def test_a_form_that_cannot_be_served_ends_the_experiment_with_its_reason(container: str, reason: str) -> None:
    message = f"{reason}: spec.server.form: torchscript disagrees with eager fp32: largest absolute error 0.5"
    inits = [ended("model", "{}"), ended("probe", "{}")] if container == "form" else []
    failed = pod(*inits, ended(container, message, code=3))
    assert diagnose.model_init_failure([failed]) == (reason, message.partition(": ")[2])
