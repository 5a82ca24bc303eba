"""Requests as a server kind wants them: each body encoded once, before any load, and each answer read.

The server kind says how (:class:`servinglab.api.RequestProtocol`, from the servers' seam); this module
knows the encodings, never a server. A body is sent as it is (with its content type), or as the one
element of a BYTES input tensor of the KServe v2 protocol with binary data. Both loops, the readiness
check of the load Job and the generator processes encode through :func:`encode_all` when their plan is
made, so the hot path only sends bytes with headers made once.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from servinglab.api import RequestEncoding, RequestProtocol, ResponseCheck
from servinglab.loadgen.payloads import Payload

#: The KServe v2 header: how many leading bytes of the body are the JSON header.
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class Request:
    """One body as it goes on the wire, with every header it is sent with."""

    body: bytes
    headers: dict[str, str]


def encode(protocol: RequestProtocol, payload: Payload) -> Request:
    """The wire form of one payload."""
    if protocol.encoding is RequestEncoding.BODY:
        return Request(payload.body, {"Content-Type": payload.content_type})
    element = struct.pack("<I", len(payload.body)) + payload.body
    tensor = {"name": protocol.input_name, "shape": [1, 1], "datatype": "BYTES",
              "parameters": {"binary_data_size": len(element)}}  # fmt: skip
    header = json.dumps({"inputs": [tensor]}, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
    return Request(header + element, headers)


def encode_all(protocol: RequestProtocol, payloads: Sequence[Payload]) -> list[Request]:
    return [encode(protocol, payload) for payload in payloads]


def answer_problem(protocol: RequestProtocol, status: int, body: bytes, check: ResponseCheck | None) -> str | None:
    """What is wrong with a 2xx answer under the response check: `unexpected_status_<n>`, `malformed_json`
    (the body, or a KServe v2 answer's JSON, unreadable), `no_outputs` (a KServe v2 answer without any)."""
    if check is None:
        return None
    if status != check.status:
        return f"unexpected_status_{status}"
    if not check.json_body:
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return "malformed_json"
    if protocol.encoding is RequestEncoding.KSERVE_V2_BINARY and not (
        isinstance(answer, dict) and isinstance(answer.get("outputs"), list) and answer["outputs"]
    ):
        return "no_outputs"
    return None
