"""How requests reach Triton: the KServe v2 inference path, and one body as the binary BYTES element of the
model's input (what the load generator sends, :mod:`servinglab.loadgen.protocol`; here for the server's own
test request, :meth:`.local.LocalTriton.predict`), and where Triton says which configuration it serves. Also
the reason a server that cannot load its model ends
with.
"""

from __future__ import annotations

import json

from servinglab.api import RequestEncoding, RequestProtocol
from servinglab.servers.triton.config import INPUT_NAME

#: The reason an experiment ends with when Triton cannot load the model (messages start "ModelLoadFailed: ").
MODEL_LOAD_FAILED = "ModelLoadFailed"
PROTOCOL = RequestProtocol(encoding=RequestEncoding.KSERVE_V2_BINARY, input_name=INPUT_NAME)


def request_path(model_name: str) -> str:
    return f"/v2/models/{model_name}/infer"


def config_path(model_name: str) -> str:
    """The model configuration Triton serves (JSON), on the inference port."""
    return f"/v2/models/{model_name}/config"


def ready_path(model_name: str) -> str:
    """200 when the model is READY (with strict readiness: every instance loaded)."""
    return f"/v2/models/{model_name}/ready"


def encode_body(body: bytes) -> tuple[bytes, dict[str, str]]:
    """(request body, headers) of one inference with `body` as the element of a [1, 1] BYTES input."""
    size = len(body).to_bytes(4, "little")
    inputs = [
        {"name": INPUT_NAME, "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(body) + 4}}
    ]
    header = json.dumps({"inputs": inputs}).encode()
    return header + size + body, {"Content-Type": "application/octet-stream",
                                  "Inference-Header-Content-Length": str(len(header))}  # fmt: skip
