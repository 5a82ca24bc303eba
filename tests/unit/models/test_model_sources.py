"""The user's model and bodies without a server: what a source is recognised as, the checksum, the cache
by digest, the pod that fetches it on Kubernetes, and the request bodies read from files and records."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from servinglab import servers
from servinglab.api import ExperimentSpec, ModelRef, ModelSource, PayloadSpec, Precision, SpecError, parse_experiment
from servinglab.api.results import to_json
from servinglab.k8s import builders as resources
from servinglab.k8s import loadbuilders
from servinglab.k8s.experiment.diagnose import (
    cluster_problems,
    model_description,
    model_init_failure,
    server_start_failure,
)
from servinglab.loadgen.payloads import PayloadError, own_payloads
from servinglab.models import fetch
from servinglab.servers.base import PodInputs, PodPlan
from servinglab.servers.torchserve import archive as modelsource
from support.manifests import experiment
from usermodels import file_server

OWNER = resources.Owner("mine", "team", "uid-1")


def plan(spec: ExperimentSpec) -> PodPlan:
    return servers.get(spec.server.kind).pod(spec, PodInputs("mine-config", "servinglab:1"))


def described_as(pod: dict[str, Any]) -> dict[str, Any] | None:
    """What status.model would hold for this pod, as JSON."""
    found = model_description(pod)
    return to_json(found) if found is not None else None


def document(model: dict[str, Any], payload: dict[str, Any] | None = None) -> dict[str, Any]:
    return experiment("mine", model=model, load={"payload": payload or {}})


def zip_with(path: Path, names: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, "x")
    return path


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["MAR-INF/MANIFEST.json", "handler.py"], "mar"),
        (["m/code/__torch__/m.py", "m/constants.pkl", "m/data.pkl"], "torchscript"),
        (["serialized_exported_program.json", "serialized_state_dict.pt"], "exported"),
    ],
)
def test_a_file_is_recognised_by_its_content_not_its_name(tmp_path: Path, names: list[str], expected: str) -> None:
    path = zip_with(tmp_path / "model.bin", names)
    fetched = modelsource.Fetched(path, None, 1)
    assert modelsource.recognise(ModelSource(path=str(path)), fetched) == expected


def test_the_handler_reads_the_input_declaration_the_packer_writes() -> None:
    import servinglab_image_handler  # shipped into the archive, so it cannot import servinglab's constant
    from servinglab import paths
    from servinglab.models.catalogue import INPUT_FILE

    assert servinglab_image_handler.INPUT_FILE == INPUT_FILE
    triton_model = (paths.handlers_dir() / "servinglab_triton_model.py").read_text()  # imports Triton's stub
    assert f'INPUT_FILE = "{INPUT_FILE}"' in triton_model


def test_a_declared_format_that_the_file_contradicts_is_refused(tmp_path: Path) -> None:
    path = zip_with(tmp_path / "model.pt", ["MAR-INF/MANIFEST.json"])
    with pytest.raises(modelsource.ModelSourceError) as refused:
        modelsource.recognise(ModelSource(path=str(path), format="torchscript"), modelsource.Fetched(path, None, 1))
    assert refused.value.reason == "ModelNotRecognized" and "the file is mar" in str(refused.value)


def test_a_plain_state_dict_is_refused_with_the_way_out(tmp_path: Path) -> None:
    path = zip_with(tmp_path / "weights.pt", ["weights/data.pkl", "weights/data/0", "weights/version"])
    with pytest.raises(modelsource.ModelSourceError) as refused:
        modelsource.recognise(ModelSource(path=str(path)), modelsource.Fetched(path, None, 1))
    assert "torch.jit.save or torch.export.save" in str(refused.value)


def test_a_download_is_checked_and_then_served_from_the_cache_by_digest(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    (served / "model.pt").write_bytes(b"model bytes")
    digest = hashlib.sha256(b"model bytes").hexdigest()
    cache = tmp_path / "cache"
    scratch = [tmp_path / f"work-{index}" for index in range(3)]
    for folder in scratch:
        folder.mkdir()
    with file_server(served) as files:
        source = ModelSource(url=f"{files.url}/model.pt", sha256=digest)
        first = fetch.download(source, scratch[0], cache)
        second = fetch.download(source, scratch[1], cache)
        with pytest.raises(modelsource.ModelSourceError) as mismatch:
            fetch.download(ModelSource(url=f"{files.url}/model.pt", sha256="f" * 64), scratch[2], cache)
    assert first.downloaded and not second.downloaded and first.sha256 == second.sha256 == digest
    assert first.path == scratch[0] / "model.pt" and second.path.read_bytes() == b"model bytes"
    assert (cache / "files" / digest / "model.pt").read_bytes() == b"model bytes"
    assert files.requests == ["/model.pt", "/model.pt"], "the cached digest is not fetched again; the wrong one is"
    assert mismatch.value.reason == "ModelChecksumMismatch" and digest in str(mismatch.value)
    assert not list(scratch[2].iterdir()) and not list((cache / "files").glob(".download-*")), "nothing left behind"


def test_precision_cannot_be_claimed_for_an_archive_with_its_own_handler(tmp_path: Path) -> None:
    path = tmp_path / "own.mar"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": "own", "handler": "mine.py"}}))
        archive.writestr("mine.py", "def handle(data, context): return data\n")
    model = ModelRef(name="mine", source=ModelSource(path=str(path)))
    prepared = modelsource.prepare(model, Precision.FP32, tmp_path / "work", cache=tmp_path / "cache")
    laid_out = sorted(p.name for p in tmp_path.iterdir())
    assert prepared.directory == tmp_path / "work" and laid_out == ["own.mar", "work"], "and the work folder is gone"
    manifest = json.loads((prepared.directory / "MAR-INF" / "MANIFEST.json").read_text())
    assert manifest["model"]["configFile"] == "model-config.yaml", "the experiment's batching must apply"
    assert manifest["model"]["modelName"] == "mine", "TorchServe registers it under the experiment's name"
    with pytest.raises(modelsource.ModelSourceError) as refused:
        modelsource.prepare(model, Precision.FP16, tmp_path / "work", cache=tmp_path / "cache")
    assert refused.value.reason == "PrecisionNotSupported" and "mine.py" in str(refused.value)


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"name": "m", "archive": "m.mar"}, "archive: replaced by source"),
        ({"name": "m", "source": {"url": "http://h/m.pt", "path": "m.pt"}}, "exactly one of url, path, pvc"),
        ({"name": "m", "source": {"path": "m.pt", "authorizationSecret": {"name": "s", "key": "k"}}}, "only a url"),
        (
            {
                "name": "m",
                "source": {"url": "http://h/m.pt?sig=SECRET", "authorizationSecret": {"name": "s", "key": "k"}},
            },
            "authorizationSecret: credentials are sent over https only; url 'http://h/m.pt?<redacted>' is not https",
        ),
        (
            {"name": "m", "source": {"url": "https://me:pw@h/m.pt"}},
            "url: 'https://h/m.pt' carries credentials (user:password@)",
        ),
        (
            {"name": "m", "source": {"url": "https://h/m.pt", "maxBytes": 2**40}},
            "1099511627776 is above the maximum 274877906944",
        ),
        ({"name": "m", "source": {"url": "ftp://h/m.pt?token=SECRET"}}, "url: 'ftp://h/m.pt?<redacted>' is not"),
        ({"name": "m", "source": {"pvc": {"claimName": "c", "path": "/abs/m.pt"}}}, "relative path"),
        ({"name": "m", "source": {"url": "http://h/m.pt"}, "input": {"kind": "tensor"}}, "needs shape"),
        ({"name": "m", "source": {"url": "http://h/m.mar", "format": "mar"}, "input": {"size": 64}}, "own handler"),
        ({"name": "resnet50", "input": {"size": 64}}, "built-in models declare their own input"),
    ],
)
def test_bad_model_fields_are_named(model: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_experiment(document(model))
    assert field in str(refused.value) and "SECRET" not in str(refused.value)


def test_kubernetes_refuses_what_only_a_local_run_can_read() -> None:
    local = parse_experiment(document({"name": "m", "source": {"path": "m.pt"}}, {"files": ["a.json"]})).spec
    assert cluster_problems(local) == [
        "spec.model.source.path: 'm.pt' is a local path; on Kubernetes use url or pvc",
        "spec.load.payload: files/records on Kubernetes come from a configMap or a pvc; name one",
    ]
    shaped = document({"name": "tiny"})
    shaped["spec"]["load"] = {"mode": "open", "generators": "auto", "shape": {"trace": {"file": "t.csv"}}}
    assert cluster_problems(parse_experiment(shaped).spec) == [
        "spec.load.shape.trace: on Kubernetes the trace file comes from payload's configMap or pvc",
        "spec.load.generators: auto counts this machine's cores; on Kubernetes give the number of load pods",
    ]


def test_the_fetching_init_container_alone_sees_the_credentials_and_the_claim() -> None:
    model = {"name": "m", "source": {"url": "https://models.example/m.pt",
                                     "authorizationSecret": {"name": "registry", "key": "token"}}}  # fmt: skip
    spec = parse_experiment(document(model)).spec
    pod = resources.deployment(OWNER, spec, plan(spec))["spec"]["template"]["spec"]
    init, probe = pod["initContainers"]
    assert "servinglab prepare-model" in init["args"][0] and "--no-count" in init["args"][0]
    assert init["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "registry", "key": "token"}
    assert "env" not in probe and "count-model" in probe["command"]
    assert not any("env" in c and "secretKeyRef" in json.dumps(c["env"]) for c in pod["containers"])
    on_claim = parse_experiment(document({"name": "m", "source": {"pvc": {"claimName": "models", "path": "m.pt"}}}))
    pod = resources.deployment(OWNER, on_claim.spec, plan(on_claim.spec))["spec"]["template"]["spec"]
    assert {"name": "model-source", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod[
        "volumes"
    ]
    assert "--mounted /model-source" in pod["initContainers"][0]["args"][0]
    assert all(m["name"] != "model-source" for c in pod["containers"] for m in c["volumeMounts"])
    assert all(m["name"] != "model-source" for m in pod["initContainers"][1]["volumeMounts"])


def test_the_load_job_is_handed_the_flops_counted_where_the_model_was_prepared() -> None:
    spec = parse_experiment(document({"name": "resnet50"})).spec
    args = loadbuilders.load_job(OWNER, spec, plan(spec), "servinglab:1", 8.18e9)["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert args[args.index("--flops-per-inference") + 1] == "8180000000"
    unknown = loadbuilders.load_job(OWNER, spec, plan(spec), "servinglab:1")["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    assert "--flops-per-inference" not in unknown


def test_the_load_job_reads_bodies_from_the_configmap_it_mounts() -> None:
    payload = {"records": "requests.jsonl", "configMap": "bodies", "check": {"json": True}}
    spec = parse_experiment(document({"name": "resnet50"}, payload)).spec
    pod = loadbuilders.load_job(OWNER, spec, plan(spec), "servinglab:1")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--payload-dir") + 1] == loadbuilders.PAYLOAD_DIR
    assert {"name": "payload", "configMap": {"name": "bodies"}} in pod["volumes"]


@pytest.mark.parametrize(
    ("model", "payload", "field", "value"),
    [
        ({"name": "m", "source": {"pvc": {"claimName": "other/weights", "path": "m.pt"}}}, None,
         "spec.model.source.pvc.claimName", "other/weights"),
        ({"name": "resnet50"}, {"files": ["a.jpg"], "configMap": "other/bodies"}, "spec.load.payload.configMap",
         "other/bodies"),
        ({"name": "resnet50"}, {"files": ["a.jpg"], "pvc": {"claimName": "../other", "path": "x"}},
         "spec.load.payload.pvc.claimName", "../other"),
    ],
)  # fmt: skip
def test_an_experiment_names_configmaps_and_claims_of_its_own_namespace_only(
    model: dict[str, Any], payload: dict[str, Any] | None, field: str, value: str
) -> None:
    """The threat model's boundary is the namespace: a ConfigMap or claim is a bare name, mounted by the
    experiment's own pods (which mount nothing of another namespace) and looked up in its namespace, so a
    name that could reach another namespace's object through the API's paths is refused, naming the field."""
    with pytest.raises(SpecError) as refused:
        parse_experiment(document(model, payload))
    assert f"{field}: '{value}'" in str(refused.value)
    own = {"files": ["a.jpg"], "pvc": {"claimName": "bodies", "path": "x"}}
    spec = parse_experiment(
        document({"name": "m", "source": {"pvc": {"claimName": "weights", "path": "m.pt"}}}, own)
    ).spec
    server = resources.deployment(OWNER, spec, plan(spec))["spec"]["template"]["spec"]
    load = loadbuilders.load_job(OWNER, spec, plan(spec), "servinglab:1")["spec"]["template"]["spec"]
    claims = [v["persistentVolumeClaim"] for v in server["volumes"] + load["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"claimName": "weights", "readOnly": True}, {"claimName": "bodies", "readOnly": True}]


def pod_with_init(state: dict[str, Any], last: dict[str, Any] | None = None) -> dict[str, Any]:
    status = {"name": "model", "state": state, "lastState": last or {}, "restartCount": 1 if last else 0}
    return {"metadata": {"name": "mine-server-x"}, "status": {"initContainerStatuses": [status]}}


def test_the_init_containers_word_becomes_the_reason_or_the_model_description() -> None:
    last = {"terminated": {"exitCode": 3, "message": "ModelChecksumMismatch: u: sha256 is a"}}
    crashed = pod_with_init({"waiting": {"reason": "CrashLoopBackOff"}}, last)
    assert model_init_failure([crashed]) == ("ModelChecksumMismatch", "u: sha256 is a")
    odd = pod_with_init({"terminated": {"exitCode": 1, "message": "sh: servinglab: not found"}})
    reason, message = model_init_failure([odd]) or ("", "")
    assert reason == "ModelPreparationFailed" and "not found" in message and "exit" in message
    done = pod_with_init({"terminated": {"exitCode": 0, "message": json.dumps({"sha256": "ab", "parameters": 3})}})
    assert model_init_failure([done]) is None and described_as(done) == {"sha256": "ab", "parameters": 3}


def test_a_server_container_that_gave_up_on_its_model_is_model_load_failed() -> None:
    gave_up = {"exitCode": 3, "message": "ModelLoadFailed: could not load m (2 attempts): boom"}
    restarted = {"name": "torchserve", "state": {"waiting": {}}, "lastState": {"terminated": gave_up}}
    pod = {"metadata": {"name": "mine-server-x"}, "status": {"containerStatuses": [restarted]}}
    expected = ("ModelLoadFailed", "server pod mine-server-x: could not load m (2 attempts): boom")
    assert server_start_failure([pod], servers.get("torchserve")) == expected
    crashed = {"name": "torchserve", "state": {"terminated": {"exitCode": 137, "message": "killed"}}}
    assert (
        server_start_failure(
            [{"metadata": {"name": "p"}, "status": {"containerStatuses": [crashed]}}], servers.get("torchserve")
        )
        is None
    )


def test_records_are_sent_in_a_seeded_order_with_their_content_types(tmp_path: Path) -> None:
    (tmp_path / "cat.png").write_bytes(b"\x89PNG fake")
    lines = [
        {"body": {"text": "hi"}},
        {"body": "plain"},
        {"bodyFile": "cat.png"},
        {"body": [1, 2], "contentType": "x/y"},
    ]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    bodies = own_payloads(PayloadSpec(records="r.jsonl", seed=3), tmp_path)
    assert sorted((p.content_type, p.body) for p in bodies) == sorted([
        ("application/json", b'{"text": "hi"}'), ("text/plain", b"plain"), ("image/png", b"\x89PNG fake"),
        ("x/y", b"[1, 2]"),
    ])  # fmt: skip
    assert bodies == own_payloads(PayloadSpec(records="r.jsonl", seed=3), tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"body": 1}\n{"bodyFile": "missing.bin"}\n')
    with pytest.raises(PayloadError) as refused:
        own_payloads(PayloadSpec(records="bad.jsonl"), tmp_path)
    assert "line 2" in str(refused.value) and "missing.bin" in str(refused.value)
