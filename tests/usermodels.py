"""Users' models, made at test time, and an HTTP file server to fetch them from.

- `torchscript_classifier`: a small CNN (image in, 10 logits out) saved with torch.jit.save;
- `exported_regressor`: an MLP over a 16-float tensor, saved with torch.export.save (.pt2);
- `onnx_classifier`: the same small CNN as `torchscript_classifier`, exported with torch.onnx.export (a
  dynamic batch axis); `onnx_with_external_data`, `onnx_custom_domain`, `onnx_fixed_batch`: ONNX models
  servinglab refuses (made by :func:`make_onnx_refusals`);
- `echo_mar`: a .mar archive with its own handler (no servinglab code in it) that answers JSON;
- `broken_mar`: a .mar whose handler raises while loading;
- `state_dict`: what torch.save of a state dict gives (a zip, but not a servable model);
- `not_a_model`: a text file.

`file_server` serves a folder on 127.0.0.x, over http or https (a throw-away CA from `make_local_ca`,
trusted by naming it in SSL_CERT_FILE), can insist on an Authorization header, answers given paths with
a redirect, and records the Authorization header each request carried.
"""

from __future__ import annotations

import hashlib
import http.server
import ssl
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

ECHO_HANDLER = '''
import json


def handle(data, context):
    """Answers each request with its body's length: a handler that knows nothing of servinglab."""
    if data is None:
        return None
    answers = []
    for row in data:
        body = row.get("body") or row.get("data") or b""
        if isinstance(body, (bytes, bytearray, str)) and body[:5] in (b"plain", "plain"):  # TorchServe decodes text/*
            answers.append("this answer is not JSON")  # what a response check must catch
        else:
            answers.append(json.dumps({"bytes": len(body) if isinstance(body, (bytes, bytearray)) else len(str(body))}))
    return answers
'''

BROKEN_HANDLER = """
def handle(data, context):
    raise RuntimeError("this handler cannot load its model: weights.bin is missing")
"""


class TinyCnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1)
        )
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class TinyMlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@dataclass(frozen=True)
class UserModels:
    folder: Path
    torchscript_classifier: Path
    exported_regressor: Path
    onnx_classifier: Path
    echo_mar: Path
    broken_mar: Path
    state_dict: Path
    not_a_model: Path

    def sha256(self, path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()


def _mar(folder: Path, name: str, handler_source: str) -> Path:
    handler = folder / f"{name}_handler.py"
    handler.write_text(textwrap.dedent(handler_source))
    archiver = Path(sys.executable).with_name("torch-model-archiver")
    subprocess.run([str(archiver), "--model-name", name, "--version", "1.0", "--handler", str(handler),
                    "--export-path", str(folder), "--force"], check=True)  # fmt: skip
    return folder / f"{name}.mar"


def make_user_models(folder: Path) -> UserModels:
    torch.manual_seed(0)
    cnn = TinyCnn().eval()
    torch.jit.save(torch.jit.script(cnn), str(folder / "classifier.pt"))
    mlp = TinyMlp().eval()
    program = torch.export.export(mlp, (torch.zeros(2, 16),),
                                  dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=1024)}})  # fmt: skip
    torch.export.save(program, str(folder / "regressor.pt2"))
    export_onnx(cnn, folder / "classifier.onnx")
    torch.save(cnn.state_dict(), str(folder / "weights-only.pt"))
    (folder / "notes.txt").write_text("not a model\n")
    return UserModels(
        folder=folder,
        torchscript_classifier=folder / "classifier.pt",
        exported_regressor=folder / "regressor.pt2",
        onnx_classifier=folder / "classifier.onnx",
        echo_mar=_mar(folder, "echo", ECHO_HANDLER),
        broken_mar=_mar(folder, "broken", BROKEN_HANDLER),
        state_dict=folder / "weights-only.pt",
        not_a_model=folder / "notes.txt",
    )


def export_onnx(module: torch.nn.Module, path: Path, size: int = 32, dynamic_batch: bool = True) -> Path:
    """`module` (image in) exported to ONNX with the legacy (TorchScript) exporter, as formbuild does; the
    batch axis dynamic unless told."""
    axes = {"pixels": {0: "batch"}, "logits": {0: "batch"}} if dynamic_batch else None
    with torch.no_grad():
        torch.onnx.export(module, (torch.zeros(1, 3, size, size),), str(path), input_names=["pixels"],
                          output_names=["logits"], dynamic_axes=axes, dynamo=False)  # fmt: skip
    return path


@dataclass(frozen=True)
class OnnxRefusals:
    """ONNX models servinglab refuses before any server starts."""

    external_data: Path  # its weights in weights.bin beside it
    custom_domain: Path  # a node of the domain com.example.custom
    fixed_batch: Path  # the classifier with its batch dimension fixed at 1
    two_inputs: Path  # x + y: the handler feeds one input


def make_onnx_refusals(folder: Path) -> OnnxRefusals:
    import onnx
    from onnx import TensorProto, helper

    torch.manual_seed(0)
    cnn = TinyCnn().eval()
    folder.mkdir(parents=True, exist_ok=True)
    exported = onnx.load_model(str(export_onnx(cnn, folder / "plain.onnx")))
    onnx.save_model(exported, str(folder / "external.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    scrambled = helper.make_node("Scramble", ["x"], ["y"], domain="com.example.custom")
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example.custom", 1)]
    custom = helper.make_model(helper.make_graph([scrambled], "custom", [x], [y]), opset_imports=opsets)
    onnx.save_model(custom, str(folder / "custom.onnx"))
    second = helper.make_tensor_value_info("second", TensorProto.FLOAT, ["batch", 16])
    added = helper.make_node("Add", ["x", "second"], ["y"])
    two = helper.make_model(helper.make_graph([added], "two", [x, second], [y]),
                            opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    onnx.save_model(two, str(folder / "two-inputs.onnx"))
    return OnnxRefusals(
        external_data=folder / "external.onnx",
        custom_domain=folder / "custom.onnx",
        fixed_batch=export_onnx(cnn, folder / "fixed-batch.onnx", dynamic_batch=False),
        two_inputs=folder / "two-inputs.onnx",
    )


@dataclass(frozen=True)
class LocalCa:
    """A CA made for one test session, and a server certificate it signed for 127.0.0.1 and 127.0.0.2."""

    ca_cert: Path  # what a client trusts: SSL_CERT_FILE
    server_cert: Path
    server_key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        return context


def make_local_ca(folder: Path, addresses: tuple[str, ...] = ("127.0.0.1", "127.0.0.2")) -> LocalCa:
    """With the openssl command line, as the control plane's PKI is made (tests/clusterenv/pki.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=servinglab-model-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    openssl("req", *key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=model-registry")
    (folder / "server.ext").write_text(
        f"subjectAltName={','.join(f'IP:{address}' for address in addresses)}\n"
        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n"
        "authorityKeyIdentifier=keyid\n"
    )
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "server.ext")  # fmt: skip
    return LocalCa(folder / "ca.crt", folder / "server.crt", folder / "server.key")


class _Handler(http.server.SimpleHTTPRequestHandler):
    required_authorization: str | None = None
    requests_seen: list[str]
    authorizations: list[tuple[str, str | None]]
    redirects: dict[str, str]

    def do_GET(self) -> None:
        self.requests_seen.append(self.path)
        self.authorizations.append((self.path, self.headers.get("Authorization")))
        if self.path in self.redirects:
            self.send_response(302)
            self.send_header("Location", self.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.required_authorization and self.headers.get("Authorization") != self.required_authorization:
            self.send_error(401, "Unauthorized")
            return
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


@dataclass
class FileServer:
    url: str
    requests: list[str]
    authorizations: list[tuple[str, str | None]]  # (path, the Authorization header it came with)
    redirects: dict[str, str]  # path -> where it redirects (may be set while the server runs)


@contextmanager
def file_server(
    folder: Path, authorization: str | None = None, host: str = "127.0.0.1", tls: LocalCa | None = None
) -> Iterator[FileServer]:
    """`folder` over HTTP (HTTPS with `tls`) at `FileServer.url`; `requests` lists every path asked for."""
    seen: list[str] = []
    authorizations: list[tuple[str, str | None]] = []
    redirects: dict[str, str] = {}
    attributes = {"required_authorization": authorization, "requests_seen": seen, "authorizations": authorizations,
                  "redirects": redirects}  # fmt: skip
    handler = type("Handler", (_Handler,), attributes)
    server = http.server.ThreadingHTTPServer((host, 0), partial(handler, directory=str(folder)))
    if tls is not None:
        server.socket = tls.server_context().wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "https" if tls is not None else "http"
    try:
        yield FileServer(f"{scheme}://{host}:{server.server_address[1]}", seen, authorizations, redirects)
    finally:
        server.shutdown()
        server.server_close()
