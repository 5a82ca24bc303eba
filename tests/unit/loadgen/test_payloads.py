"""Generated payloads: decodable by the handler at the requested size, deterministic per seed. The
user's own files: read from the payload folder only (no absolute path, '..' or symlink leads out, a
mounted ConfigMap's own symlinks are followed), each and all of them bounded."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from servinglab.api import PayloadFormat, PayloadSpec
from servinglab.loadgen.payloads import (
    MAX_BODIES,
    MAX_BODY_BYTES,
    MAX_TOTAL_BYTES,
    Payload,
    PayloadError,
    make_payloads,
    own_payloads,
)
from servinglab_imaging import decode_image
from support.manifests import experiment


@pytest.mark.parametrize("fmt", list(PayloadFormat))
def test_payloads_decode_to_the_model_input_size(fmt: PayloadFormat) -> None:
    payloads = make_payloads(fmt, 64, 3, seed=1)
    assert len(payloads) == 3
    assert len(set(payloads)) == 3
    for body in payloads:
        assert decode_image(body, 64).shape == (64, 64, 3)


def test_same_seed_same_bytes() -> None:
    assert make_payloads(PayloadFormat.PNG, 32, 2, 5) == make_payloads(PayloadFormat.PNG, 32, 2, 5)
    assert make_payloads(PayloadFormat.PNG, 32, 2, 5) != make_payloads(PayloadFormat.PNG, 32, 2, 6)


# -- the user's files: confined to the payload folder, bounded --------------------------------------------

TOKEN = "eyJhbGciOiJSUzI1NiJ9.secret-service-account-token"


@pytest.fixture()
def payload_dir(tmp_path: Path) -> Path:
    """A payload folder, beside a 'token' file outside it (as the pod's ServiceAccount token is)."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "token").write_text(TOKEN)
    folder = tmp_path / "payload"
    folder.mkdir()
    (folder / "ok.json").write_text('{"x": 1}')
    return folder


def refusal(spec: PayloadSpec, root: Path) -> str:
    with pytest.raises(PayloadError) as refused:
        own_payloads(spec, root)
    message = str(refused.value)
    assert TOKEN not in message and "secret-service" not in message
    return message


@pytest.mark.parametrize(
    ("body_file", "why"),
    [("ABSOLUTE", "leads outside the payload folder"), ("../secrets/token", "leads outside the payload folder"),
     ("link", "leads outside the payload folder")],
    ids=["absolute", "dot-dot", "symlink"],
)  # fmt: skip
def test_a_records_body_file_outside_the_payload_folder_is_refused(payload_dir: Path, body_file: str, why: str) -> None:
    token = payload_dir.parent / "secrets" / "token"
    (payload_dir / "link").symlink_to(token)
    name = str(token) if body_file == "ABSOLUTE" else body_file
    (payload_dir / "r.jsonl").write_text(json.dumps({"body": 1}) + "\n" + json.dumps({"bodyFile": name}) + "\n")
    message = refusal(PayloadSpec(records="r.jsonl"), payload_dir)
    assert message.startswith("load.payload.records: r.jsonl, line 2: bodyFile: ") and why in message, message


def test_files_and_records_that_are_symlinks_out_are_refused(payload_dir: Path) -> None:
    (payload_dir / "token.json").symlink_to(payload_dir.parent / "secrets" / "token")
    (payload_dir / "records.jsonl").symlink_to(payload_dir.parent / "secrets" / "token")
    assert "load.payload.files: 'token.json' leads outside" in refusal(PayloadSpec(files=["token.json"]), payload_dir)
    message = refusal(PayloadSpec(records="records.jsonl"), payload_dir)
    assert "load.payload.records: 'records.jsonl' leads outside the payload folder" in message


def test_symlinks_that_stay_inside_are_followed_as_a_mounted_configmap_has_them(payload_dir: Path) -> None:
    # a ConfigMap volume: <key> -> ..data/<key>, ..data -> ..2025_01_01_00_00_00.1/
    (payload_dir / "..2025_01_01_00_00_00.1").mkdir()
    (payload_dir / "..2025_01_01_00_00_00.1" / "a.json").write_text('{"a": 1}')
    (payload_dir / "..2025_01_01_00_00_00.1" / "r.jsonl").write_text('{"bodyFile": "a.json"}\n{"body": "b"}\n')
    (payload_dir / "..data").symlink_to("..2025_01_01_00_00_00.1")
    for key in ("a.json", "r.jsonl"):
        (payload_dir / key).symlink_to(f"..data/{key}")
    assert own_payloads(PayloadSpec(files=["a.json"]), payload_dir) == [Payload(b'{"a": 1}', "application/json")]
    records = own_payloads(PayloadSpec(records="r.jsonl"), payload_dir)
    assert sorted(p.body for p in records) == [b"b", b'{"a": 1}']


def test_more_records_than_the_load_keeps_are_refused_by_line(payload_dir: Path) -> None:
    (payload_dir / "many.jsonl").write_text('{"body": 1}\n' * (MAX_BODIES + 1))
    message = refusal(PayloadSpec(records="many.jsonl"), payload_dir)
    assert message == (
        f"load.payload.records: many.jsonl, line {MAX_BODIES + 1}: more than {MAX_BODIES} records; at most that many"
    )


def test_a_body_past_its_limit_and_bodies_past_the_total_are_refused(payload_dir: Path) -> None:
    with (payload_dir / "huge.bin").open("wb") as huge:  # sparse: no disk used
        huge.truncate(MAX_BODY_BYTES + 1)
    message = refusal(PayloadSpec(files=["ok.json", "huge.bin"]), payload_dir)
    assert message == "load.payload.files: 'huge.bin' is larger than 64 MiB; at most that is read"
    with (payload_dir / "big.bin").open("wb") as big:
        big.truncate(60 << 20)
    (payload_dir / "r.jsonl").write_text('{"bodyFile": "big.bin"}\n' * 5)  # 300 MiB of bodies
    message = refusal(PayloadSpec(records="r.jsonl"), payload_dir)
    over = f"the bodies so far are over {MAX_TOTAL_BYTES >> 20} MiB; at most that in all"
    assert message == f"load.payload.records: r.jsonl, line 5: {over}"


def test_a_fifo_is_refused_not_waited_on(payload_dir: Path) -> None:
    os.mkfifo(payload_dir / "pipe.json")
    assert "'pipe.json' is not a regular file" in refusal(PayloadSpec(files=["pipe.json"]), payload_dir)


def test_a_claim_folder_that_is_a_symlink_out_of_the_claim_is_refused_by_the_load_job(
    tmp_path: Path, servinglab_cmd: list[str]
) -> None:
    """`servinglab loadtest` (the load Job's command) with a claim mounted at claim/ and the payload
    folder claim/photos a symlink to the folder holding the token: refused before anything is sent."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "token").write_text(TOKEN)
    (tmp_path / "claim").mkdir()
    (tmp_path / "claim" / "photos").symlink_to(tmp_path / "secrets")
    spec = experiment("leak", load={"payload": {"files": ["token"], "pvc": {"claimName": "c", "path": "photos"}}})
    (tmp_path / "spec.yaml").write_text(json.dumps(spec))
    ran = subprocess.run(
        [*servinglab_cmd, "loadtest", "--target", "http://127.0.0.1:9", "--model", "tiny", "--spec-file",
         str(tmp_path / "spec.yaml"), "--payload-dir", str(tmp_path / "claim" / "photos"),
         "--termination-log", str(tmp_path / "termination-log"), "--ready-timeout", "1"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    said = (tmp_path / "termination-log").read_text()
    assert ran.returncode == 1 and "load.payload.pvc.path: 'photos' leads outside the payload folder" in said, said
    assert TOKEN not in said and TOKEN not in ran.stdout + ran.stderr
