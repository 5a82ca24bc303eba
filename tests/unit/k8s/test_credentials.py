"""Model credentials: the Authorization header stays with the host it was given for, https is never left,
URLs are shown without their query strings, and on Kubernetes a Secret is sent only where the platform
allowed it (the chart's modelCredentials). Real HTTPS servers on 127.0.0.1 and 127.0.0.2, with a CA made
for the test and trusted through SSL_CERT_FILE."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from servinglab.api import ModelRef, ModelSource, Precision, parse_experiment
from servinglab.api.results import to_json
from servinglab.k8s import credentials
from servinglab.k8s.experiment.diagnose import model_description
from servinglab.k8s.settings import Settings
from servinglab.models import fetch as modelfetch
from servinglab.models.catalogue import INFO_FILE
from servinglab.servers.torchserve import archive as modelsource
from support.manifests import experiment
from usermodels import LocalCa, file_server, make_local_ca

TOKEN = "Bearer s3cret-token"


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCa:
    return make_local_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture()
def trusted(local_ca: LocalCa, monkeypatch: pytest.MonkeyPatch) -> LocalCa:
    monkeypatch.setenv("SSL_CERT_FILE", str(local_ca.ca_cert))
    return local_ca


@pytest.fixture()
def served(tmp_path: Path) -> Path:
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"the model")
    return folder


def described_as(pod: dict[str, Any]) -> dict[str, Any] | None:
    """What status.model would hold for this pod, as JSON."""
    found = model_description(pod)
    return to_json(found) if found is not None else None


def fetch(url: str, scratch: Path, authorization: str | None = TOKEN) -> modelsource.Fetched:
    scratch.mkdir(exist_ok=True)
    return modelfetch.download(ModelSource(url=url), scratch, authorization=authorization)


def test_a_redirect_to_another_host_is_followed_without_the_credentials(
    trusted: LocalCa, served: Path, tmp_path: Path
) -> None:
    with (
        file_server(served, tls=trusted, host="127.0.0.1") as registry,
        file_server(served, tls=trusted, host="127.0.0.2") as storage,
    ):
        registry.redirects["/model.pt"] = f"{storage.url}/model.pt?X-Amz-Signature=abc"
        fetched = fetch(f"{registry.url}/model.pt", tmp_path / "work")
    assert fetched.path.read_bytes() == b"the model", "the redirect is followed"
    assert registry.authorizations == [("/model.pt", TOKEN)]
    assert storage.authorizations == [("/model.pt?X-Amz-Signature=abc", None)], "no credentials for the other host"


def test_a_redirect_on_the_same_host_keeps_the_credentials(trusted: LocalCa, served: Path, tmp_path: Path) -> None:
    with file_server(served, authorization=TOKEN, tls=trusted) as registry:
        registry.redirects["/v2/blobs/latest"] = f"{registry.url}/model.pt"
        fetched = fetch(f"{registry.url}/v2/blobs/latest", tmp_path / "work")
    assert fetched.path.read_bytes() == b"the model"
    assert registry.authorizations == [("/v2/blobs/latest", TOKEN), ("/model.pt", TOKEN)]


def test_a_redirect_from_https_to_http_is_refused(trusted: LocalCa, served: Path, tmp_path: Path) -> None:
    with file_server(served, tls=trusted) as registry, file_server(served, host="127.0.0.2") as plain:
        registry.redirects["/model.pt"] = f"{plain.url}/model.pt?token=abc"
        with pytest.raises(modelsource.ModelSourceError) as refused:
            fetch(f"{registry.url}/model.pt", tmp_path / "work")
    assert refused.value.reason == "ModelDownloadFailed"
    assert f"to {plain.url}/model.pt?<redacted>; refused" in str(refused.value) and "abc" not in str(refused.value)
    assert plain.requests == [], "nothing is asked of the http host"
    assert not list((tmp_path / "work").iterdir()), "nothing is left behind"


def test_credentials_never_go_over_http(served: Path, tmp_path: Path) -> None:
    with file_server(served) as plain, pytest.raises(modelsource.ModelSourceError) as refused:
        fetch(f"{plain.url}/model.pt", tmp_path / "work")
    assert refused.value.reason == "ModelDownloadFailed"
    assert "credentials are sent over https only" in str(refused.value) and plain.requests == []


def test_a_query_string_is_never_shown(trusted: LocalCa, served: Path, tmp_path: Path) -> None:
    with file_server(served, tls=trusted) as registry:
        model = ModelRef(
            name="m", source=ModelSource(url=f"{registry.url}/model.pt?X-Amz-Signature=SIGNED", format="mar")
        )
        with pytest.raises(modelsource.ModelSourceError) as failed:  # the file is no .mar: the message names the URL
            modelsource.prepare(model, Precision.FP32, tmp_path / "m")
        missing = ModelRef(name="m", source=ModelSource(url=f"{registry.url}/gone.pt?X-Amz-Signature=SIGNED"))
        with pytest.raises(modelsource.ModelSourceError) as not_found:
            modelsource.prepare(missing, Precision.FP32, tmp_path / "m")
    for message in (str(failed.value), str(not_found.value)):
        assert "?<redacted>" in message and "SIGNED" not in message, message
    assert "HTTP 404" in str(not_found.value)


def test_what_status_says_of_a_model_redacts_its_url(trusted: LocalCa, tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    with zipfile.ZipFile(served / "own.mar", "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": "own", "handler": "h.py"}}))
    with file_server(served, tls=trusted) as registry:
        url = f"{registry.url}/own.mar?sig=SIGNED&expires=1"
        prepared = modelsource.prepare(
            ModelRef(name="own", source=ModelSource(url=url)), Precision.FP32, tmp_path / "m"
        )
    assert prepared.info["source"] == f"{registry.url}/own.mar?<redacted>"
    assert "SIGNED" not in (tmp_path / "m" / INFO_FILE).read_text()


# -- the platform's opt-in ------------------------------------------------------------------------------


def spec_with(url: str, secret: str = "registry", key: str = "token") -> Any:
    source = {"url": url, "authorizationSecret": {"name": secret, "key": key}}
    return parse_experiment(experiment("m", model={"name": "m", "source": source})).spec


ALLOWED = credentials.parse(
    json.dumps([
        {"secret": "registry", "key": "token", "hosts": ["models.example.com", "*.blob.example.net"]},
        {"secret": "team-a", "key": "token", "hosts": ["a.example.com"], "namespaces": ["team-a"]},
    ])
)  # fmt: skip


@pytest.mark.parametrize(
    ("url", "secret", "namespace", "problem"),
    [
        ("https://models.example.com/m.pt", "registry", "ml", None),
        ("https://MODELS.example.com:8443/m.pt", "registry", "ml", None),
        ("https://eu.blob.example.net/m.pt", "registry", "ml", None),
        ("https://a.example.com/m.pt", "team-a", "team-a", None),
        ("https://attacker.example.org/m.pt", "registry", "ml",
         "Secret registry key token may be sent to *.blob.example.net, models.example.com only, not to host "
         "attacker.example.org"),
        ("https://blob.example.net/m.pt", "registry", "ml", "not to host blob.example.net"),
        ("https://models.example.com/m.pt", "cloud-admin", "ml",
         "Secret cloud-admin key token is not allowed as model credentials in namespace ml"),
        ("https://a.example.com/m.pt", "team-a", "team-b", "Secret team-a key token is not allowed"),
    ],
)  # fmt: skip
def test_only_the_secret_keys_and_hosts_the_platform_allowed_are_sent(
    url: str, secret: str, namespace: str, problem: str | None
) -> None:
    found = credentials.problems(spec_with(url, secret), namespace, ALLOWED)
    if problem is None:
        assert found == []
    else:
        (message,) = found
        assert message.startswith("spec.model.source.authorizationSecret: ") and problem in message, message


def test_without_an_opt_in_no_secret_is_sent_and_without_a_secret_nothing_is_asked() -> None:
    assert credentials.problems(spec_with("https://models.example.com/m.pt"), "ml", ())
    plain = parse_experiment(experiment("m")).spec
    assert credentials.problems(plain, "ml", ()) == []


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("not json", "SERVINGLAB_MODEL_CREDENTIALS (the chart's modelCredentials)"),
        ('[{"secret": "registry", "key": "token"}]', "0.hosts: Field required"),
        ('[{"secret": "registry", "key": "token", "hosts": []}]', "0.hosts"),
        ('[{"secret": "Registry!", "key": "token", "hosts": ["h"]}]', "0.secret"),
        ('[{"secret": "r", "key": "token", "hosts": ["https://h/"]}]', "0.hosts.0"),
    ],
)
def test_a_bad_opt_in_stops_the_operator_naming_the_entry(
    value: str, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(credentials.ENV, value)
    with pytest.raises(ValueError) as refused:
        Settings.from_env()
    assert named in str(refused.value)


def test_the_operator_reads_its_opt_in_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(credentials.ENV, raising=False)
    assert Settings.from_env().model_credentials == ()
    monkeypatch.setenv(credentials.ENV, '[{"secret": "registry", "key": "token", "hosts": ["models.example.com"]}]')
    (allowed,) = Settings.from_env().model_credentials
    assert (allowed.secret, allowed.key, allowed.hosts) == ("registry", "token", ("models.example.com",))


# -- what status says: the model's description, the probe's figures only ---------------------------------


def pod_said(model: dict[str, Any], probe: object) -> dict[str, Any]:
    def ended(name: str, message: object) -> dict[str, Any]:
        text = message if isinstance(message, str) else json.dumps(message)
        return {"name": name, "state": {"terminated": {"exitCode": 0, "message": text}}}

    return {"metadata": {"name": "m-server-x"},
            "status": {"initContainerStatuses": [ended("model", model), ended("probe", probe)]}}  # fmt: skip


def test_status_takes_the_description_from_the_fetcher_and_only_the_figures_from_the_probe() -> None:
    described = {"name": "m", "source": "https://h/m.pt?<redacted>", "sha256": "ab" * 32, "format": "exported"}
    counts = {"parameters": 660, "flopsPerInference": 1280, "countNote": None}
    assert described_as(pod_said(described, counts)) == {
        **described,
        **{k: v for k, v in counts.items() if v is not None},
    }
    forged = {**counts, "sha256": "0" * 64, "source": "https://trusted.example/m.pt"}
    assert described_as(pod_said(described, forged)) == described, "a probe that says more is not believed"
    assert described_as(pod_said(described, {**counts, "parameters": "many"})) == described
    assert described_as(pod_said(described, "not json")) == described
