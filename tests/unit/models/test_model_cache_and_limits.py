"""The shared model cache and the size of what a model may bring: a changed cached file is fetched or built
again (or refused), never served; an archive that unpacks to gigabytes, a download that never ends, a
folder that links out of itself are refused; and the server pod is laid out so that the user's code never
runs where the cache is writable and no volume can fill the node's disk."""

from __future__ import annotations

import hashlib
import http.server
import json
import struct
import subprocess
import threading
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from servinglab import servers
from servinglab.api import ModelRef, ModelSource, Precision, parse_experiment
from servinglab.k8s import builders as resources
from servinglab.models import builtins as models
from servinglab.models import digests, fetch
from servinglab.models.build import build
from servinglab.models.catalogue import handler_paths
from servinglab.servers.base import PodInputs
from servinglab.servers.torchserve import archive as modelsource
from support.manifests import experiment
from usermodels import file_server

OWNER = resources.Owner("mine", "team", "uid-1")
GIB = 2**30


def torchscript_like(path: Path, payload: bytes = b"weights") -> Path:
    """A zip that is recognised as a TorchScript file (nothing here loads it)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("m/code/__torch__/m.py", "def forward(self, x): return x\n")
        archive.writestr("m/constants.pkl", b"\x80\x02).")
        archive.writestr("m/data/0", payload)
    return path


# -- the cache ------------------------------------------------------------------------------------------


def test_a_cached_download_that_changed_is_fetched_again_and_never_served(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    original = torchscript_like(served / "model.pt").read_bytes()
    digest = hashlib.sha256(original).hexdigest()
    cache = tmp_path / "cache"
    with file_server(served) as files:
        model = ModelRef(name="m", source=ModelSource(url=f"{files.url}/model.pt", sha256=digest))
        first = modelsource.prepare(model, Precision.FP32, tmp_path / "first", cache=cache, count=False)
        kept = cache / "files" / digest / "model.pt"
        poisoned = bytearray(kept.read_bytes())
        poisoned[-1] ^= 0xFF  # another experiment's model, or a disk, changed one byte
        kept.write_bytes(bytes(poisoned))
        second = modelsource.prepare(model, Precision.FP32, tmp_path / "second", cache=cache, count=False)
        third = modelsource.prepare(model, Precision.FP32, tmp_path / "third", cache=cache, count=False)
    assert files.requests == ["/model.pt", "/model.pt"], "fetched again once the kept copy no longer matched"
    assert first.info["downloaded"] and second.info["downloaded"] and not third.info["downloaded"]
    for prepared in (second, third):
        assert (prepared.directory / "model.pt").read_bytes() == original, "what is served is what was asked for"
    assert kept.read_bytes() == original, "the cache is mended"


def test_the_cache_holds_no_code_and_a_packed_model_gets_this_installs_handler(tmp_path: Path) -> None:
    """A packed folder is laid out afresh from the checked file every time: nothing executable is reused."""
    source_file = torchscript_like(tmp_path / "model.pt")
    cache = tmp_path / "cache"
    model = ModelRef(name="m", source=ModelSource(path=str(source_file)))
    prepared = modelsource.prepare(model, Precision.FP16, tmp_path / "served", cache=cache, count=False)
    for shipped in handler_paths():
        assert (prepared.directory / shipped.name).read_bytes() == shipped.read_bytes()
    assert not cache.exists(), "a local file is not kept: nothing in the cache to poison"


@pytest.fixture()
def builds(tmp_path: Path, servinglab_cmd: list[str]) -> Path:
    """A private build root of the tiny model (build, stamp, digests), for a test to tamper with."""
    root = tmp_path / "builds"
    subprocess.run([*servinglab_cmd, "build-model", "tiny", "--build-dir", str(root), "--quiet"], check=True)
    return root


def test_a_build_that_changed_is_not_current_and_is_rebuilt(builds: Path) -> None:
    archive = models.build_folder("tiny", builds)
    assert models.is_current("tiny", builds), models.build_difference("tiny", builds)
    code = archive / models.MODEL_FILE
    genuine = code.read_bytes()
    code.write_bytes(genuine + b"\nimport os  # anything at all runs in every later server\n")
    assert not models.is_current("tiny", builds)
    assert f"{models.MODEL_FILE} has sha256" in str(models.build_difference("tiny", builds))
    inputs = (archive.parent / models.STAMP_FILE).read_text().strip()
    digests.write_manifest(archive, archive.parent / models.DIGESTS_FILE, inputs=inputs)  # unkeyed: a local build
    assert not models.is_current("tiny", builds), "the model's code is checked against the one this install ships"
    assert models.build_difference("tiny", builds) == f"{models.MODEL_FILE} is not the file this servinglab ships"
    _, rebuilt = build("tiny", builds)
    assert rebuilt and code.read_bytes() == genuine and models.is_current("tiny", builds)


def test_a_laid_out_model_gets_this_installs_handler_never_a_cached_one(builds: Path, tmp_path: Path) -> None:
    """The handler TorchServe imports is copied from this install when the build is laid out, so a cache
    (which holds builds) never holds the code a server runs."""
    into = tmp_path / "store" / "tiny"
    servers.get("torchserve").layout_builtin("tiny", models.install("tiny", into, builds), into)
    for shipped in handler_paths():
        assert (into / shipped.name).read_bytes() == shipped.read_bytes()
        assert not (models.build_folder("tiny", builds) / shipped.name).exists()


@pytest.mark.parametrize(
    ("tamper", "difference"),
    [
        (lambda a: (a / models.WEIGHTS_FILE).write_bytes(b"other weights"), "weights.pt has sha256"),
        (lambda a: (a / "torch.py").write_text("print('imported first')\n"), "torch.py is not in the manifest"),
        (lambda a: (a / models.COUNTS_FILE).unlink(), f"{models.COUNTS_FILE} is missing"),
    ],
)
def test_a_copy_of_a_build_that_differs_from_its_digests_is_refused(
    builds: Path, tmp_path: Path, tamper: Any, difference: str
) -> None:
    """As when the cache changes between the check and the copy: the copy is what is checked."""
    tamper(models.build_folder("tiny", builds))
    into = tmp_path / "store" / "tiny"
    with pytest.raises(models.BuildChanged) as refused:
        models.install("tiny", into, builds)
    assert difference in str(refused.value) and not into.exists()


# -- bounded archives, downloads and folders --------------------------------------------------------------

BOMB_BYTES = 3 * GIB


def _write_zeros_bomb(path: Path, size: int) -> None:
    """A genuine .mar whose weights.bin is `size` zero bytes, deflated to about a thousandth of that.
    Deflating gigabytes takes long; after a full flush the compressor starts afresh, so every 1 MiB of
    zeros deflates to the same block, computed once (zipfile still computes the CRC of every byte)."""
    chunk = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
    end = deflate.flush()

    class Repeating:
        def compress(self, data: bytes) -> bytes:
            assert data == chunk
            return block

        def flush(self) -> bytes:
            return end

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": "bomb", "handler": "h.py"}}))
        with archive.open("weights.bin", "w", force_zip64=True) as entry:
            entry._compressor = Repeating()  # type: ignore[attr-defined]
            for _ in range(size // len(chunk)):
                entry.write(chunk)


@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / "bomb.mar"
    _write_zeros_bomb(path, BOMB_BYTES)
    with zipfile.ZipFile(path) as archive:  # what it is: gigabytes, in a few megabytes
        assert archive.getinfo("weights.bin").file_size == BOMB_BYTES
    assert path.stat().st_size < 8 * 2**20
    return path


def test_an_archive_that_unpacks_to_gigabytes_is_refused_before_anything_is_written(
    zip_bomb: Path, tmp_path: Path
) -> None:
    model = ModelRef(name="bomb", source=ModelSource(path=str(zip_bomb), maxBytes=GIB))
    with pytest.raises(modelsource.ModelSourceError) as refused:
        modelsource.prepare(model, Precision.FP32, tmp_path / "store" / "bomb")
    with zipfile.ZipFile(zip_bomb) as archive:
        declared = sum(member.file_size for member in archive.infolist())
    assert refused.value.reason == "ModelTooLarge"
    assert f"the archive unpacks to {declared} bytes, as its headers say" in str(refused.value)
    assert f"more than maxBytes ({GIB} bytes)" in str(refused.value) and "spec.model.source.maxBytes" in str(
        refused.value
    )
    assert list((tmp_path / "store").iterdir()) == [], "nothing unpacked, nothing left"


def test_an_archive_whose_headers_lie_is_cut_at_what_they_say(zip_bomb: Path, tmp_path: Path) -> None:
    """Headers that say 1 MiB for gigabytes of zeros: unpacking stops at 1 MiB and the archive is refused
    as damaged (its checksum is that of gigabytes), not written out whole."""
    data = zip_bomb.read_bytes()
    assert data.count(struct.pack("<Q", BOMB_BYTES)) == 2, "the size, in the local and the central header"
    liar = tmp_path / "liar.mar"
    liar.write_bytes(data.replace(struct.pack("<Q", BOMB_BYTES), struct.pack("<Q", 2**20)))
    model = ModelRef(name="liar", source=ModelSource(path=str(liar), maxBytes=GIB))
    with pytest.raises(modelsource.ModelSourceError) as refused:
        modelsource.prepare(model, Precision.FP32, tmp_path / "store" / "liar")
    assert refused.value.reason == "ModelNotRecognized" and "Bad CRC-32 for file 'weights.bin'" in str(refused.value)
    assert list((tmp_path / "store").iterdir()) == []


class _Endless(http.server.BaseHTTPRequestHandler):
    """Zeros, for ever; with `announce`, after a Content-Length that says so."""

    announce: str | None = None
    sent: list[int]

    def do_GET(self) -> None:
        self.send_response(200)
        if self.announce:
            self.send_header("Content-Length", self.announce)
        self.end_headers()
        chunk = bytes(1 << 16)
        try:
            while True:
                self.wfile.write(chunk)
                self.sent.append(len(chunk))
        except OSError:  # the client hung up
            pass

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


@contextmanager
def endless_server(announce: str | None = None) -> Iterator[tuple[str, list[int]]]:
    sent: list[int] = []
    handler = type("Handler", (_Endless,), {"announce": announce, "sent": sent})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/model.pt", sent
    finally:
        server.shutdown()
        server.server_close()


def test_a_download_that_never_ends_is_refused_at_the_limit(tmp_path: Path) -> None:
    limit = 8 * 2**20
    with endless_server() as (url, sent), pytest.raises(modelsource.ModelSourceError) as refused:
        fetch.download(ModelSource(url=url, maxBytes=limit), tmp_path)
    assert refused.value.reason == "ModelTooLarge" and "bytes and counting" in str(refused.value)
    assert sum(sent) >= limit, "refused when the limit was reached, not before"
    assert list(tmp_path.iterdir()) == [], "the partial download is removed"


def test_a_download_that_announces_too_much_is_refused_before_its_body(tmp_path: Path) -> None:
    with endless_server(announce=str(64 * GIB)) as (url, _), pytest.raises(modelsource.ModelSourceError) as refused:
        fetch.download(ModelSource(url=url), tmp_path)
    assert refused.value.reason == "ModelTooLarge"
    assert f"the server announces {64 * GIB} bytes (Content-Length)" in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_a_file_larger_than_allowed_is_refused_unread(tmp_path: Path) -> None:
    big = torchscript_like(tmp_path / "model.pt", bytes(4096))
    model = ModelRef(name="m", source=ModelSource(path=str(big), maxBytes=1024))
    with pytest.raises(modelsource.ModelSourceError) as refused:
        modelsource.prepare(model, Precision.FP32, tmp_path / "store" / "m")
    assert refused.value.reason == "ModelTooLarge" and f"{big.stat().st_size} bytes, more than" in str(refused.value)


def test_a_folder_or_a_claim_path_that_links_out_of_itself_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere" / "token"
    secret.parent.mkdir()
    secret.write_text("someone else's")
    folder = tmp_path / "claim" / "model"
    (folder / "MAR-INF").mkdir(parents=True)
    (folder / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"model": {"modelName": "m", "handler": "h.py"}}))
    (folder / "extra.txt").symlink_to(secret)
    with pytest.raises(modelsource.ModelSourceError) as out_of_folder:
        modelsource.prepare(ModelRef(name="m", source=ModelSource(path=str(folder))), Precision.FP32, tmp_path / "a")
    assert out_of_folder.value.reason == "ModelNotRecognized" and "extra.txt is a symlink out of" in str(
        out_of_folder.value
    )
    (folder / "extra.txt").unlink()
    (tmp_path / "claim" / "link.pt").symlink_to(secret)
    on_claim = ModelRef(name="m", source=ModelSource(pvc={"claimName": "c", "path": "link.pt"}))
    with pytest.raises(modelsource.ModelSourceError) as out_of_claim:
        modelsource.prepare(on_claim, Precision.FP32, tmp_path / "b", mounted=tmp_path / "claim")
    assert "a symlink that leaves the claim" in str(out_of_claim.value)
    prepared = modelsource.prepare(ModelRef(name="m", source=ModelSource(path=str(folder))), Precision.FP32,
                                   tmp_path / "c")  # fmt: skip
    assert prepared.info["format"] == "directory", "the same folder without the link is served"
    with pytest.raises(modelsource.ModelSourceError) as unchecked:  # a digest that cannot be checked is no check
        modelsource.prepare(ModelRef(name="m", source=ModelSource(path=str(folder), sha256="a" * 64)),
                            Precision.FP32, tmp_path / "d")  # fmt: skip
    assert unchecked.value.reason == "ModelChecksumMismatch" and "a folder, which has no single digest" in str(
        unchecked.value
    )


# -- the server pod ------------------------------------------------------------------------------------------


def server_pod(model: dict[str, Any], cache_claim: str | None = "model-cache") -> dict[str, Any]:
    spec = parse_experiment(experiment("mine", model=model)).spec
    plan = servers.get(spec.server.kind).pod(spec, PodInputs("mine-config", "servinglab:1", cache_claim))
    pod: dict[str, Any] = resources.deployment(OWNER, spec, plan)["spec"]["template"]["spec"]
    return pod


def mounts(container: dict[str, Any]) -> dict[str, bool]:
    """Volume name -> whether it is mounted read-only."""
    return {mount["name"]: bool(mount.get("readOnly")) for mount in container["volumeMounts"]}


def test_the_users_code_runs_only_where_the_cache_and_the_credentials_are_not() -> None:
    source = {"url": "https://models.example.com/m.pt2", "authorizationSecret": {"name": "registry", "key": "token"}}
    pod = server_pod({"name": "m", "source": source, "input": {"kind": "tensor", "shape": [16]}})
    fetcher, probe = pod["initContainers"]
    (server,) = pod["containers"]
    assert mounts(fetcher)["model-cache"] is False, "the fetcher, which runs servinglab's code alone, keeps downloads"
    assert "--cache /model-cache" in fetcher["args"][0] and "--no-count" in fetcher["args"][0]
    assert mounts(probe) == {"model-store": True, "probe-tmp": False}, "the probe loads the model: nothing else"
    assert "env" not in probe and probe["command"][:2] == ["servinglab", "count-model"]
    assert "model-cache" not in mounts(server), "TorchServe never sees the cache"
    assert not any("secretKeyRef" in json.dumps(container) for container in (probe, server))
    builtin = server_pod({"name": "tiny"})
    (only,) = builtin["initContainers"]
    assert "--into /home/model-server/model-store/tiny" in only["args"][0], "the copy of a build is checked"


@pytest.mark.parametrize(
    ("model", "store"),
    [
        ({"name": "m", "source": {"url": "https://h/m.pt"}}, f"{(2 * 16 * 1024) + 256}Mi"),
        ({"name": "m", "source": {"url": "https://h/m.pt", "maxBytes": 100 * 2**20}}, "456Mi"),
        ({"name": "tiny"}, "2304Mi"),
    ],
)
def test_every_empty_dir_of_the_server_pod_has_a_size_limit(model: dict[str, Any], store: str) -> None:
    for cache_claim in ("model-cache", None):
        volumes = {volume["name"]: volume for volume in server_pod(model, cache_claim)["volumes"]}
        empty = {name: volume["emptyDir"] for name, volume in volumes.items() if "emptyDir" in volume}
        assert all(dir_.get("sizeLimit") for dir_ in empty.values()), empty
        assert empty["model-store"]["sizeLimit"] == store
