"""Which model an experiment serves: a built-in demo model, or the user's own from a source.

Part of the experiment spec (:mod:`servinglab.api.experiment`); the model store
(:mod:`servinglab.models`) fetches, checks and counts what these name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from servinglab.api.meta import SpecModel, VolumePath

#: Built-in demo models shipped in model-store/ (see :mod:`servinglab.models`).
BUILTIN_MODELS = ("resnet50", "tiny", "fixed-latency")
#: Built-in models that run eager only, and why: what `server.form` other than eager is refused with.
EAGER_ONLY_MODELS = {
    "fixed-latency": "its forward waits in Python (time.sleep), which a traced, exported or compiled form "
    "would drop or split",
}


class ModelFormat(StrEnum):
    """What a model source holds. `auto` decides from the file name, then from the content."""

    AUTO = "auto"
    MAR = "mar"  # a server's own model archive, served with its own handler
    DIRECTORY = "directory"  # the same, unpacked into a folder
    TORCHSCRIPT = "torchscript"  # torch.jit.save output, packed with servinglab's handler
    EXPORTED = "exported"  # torch.export.save output (.pt2), packed with servinglab's handler
    ONNX = "onnx"  # an ONNX model (.onnx, one file), run in ONNX Runtime by servinglab's handler


class SecretKeyRef(SpecModel):
    """One key of a Secret in the experiment's namespace."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]


#: What a model source may bring onto a node unless its spec says otherwise (spec.model.source.maxBytes):
#: the memory of the GPU the project was built around (a T4); a model larger than that is not served by one.
MODEL_MAX_BYTES_DEFAULT = 16 * 2**30
#: The most maxBytes may be raised to: every byte of it is node disk (the server pod's emptyDirs).
MODEL_MAX_BYTES_LIMIT = 256 * 2**30


def redact_url(url: str) -> str:
    """A URL as it may be shown (status, results, messages, logs): a query string or fragment (pre-signed
    tokens live there) becomes `<redacted>`; the scheme, host and path stay."""
    head, query_mark, _ = url.partition("?")
    head, fragment_mark, _ = head.partition("#")
    if query_mark:
        return f"{head}?<redacted>"
    return f"{head}#<redacted>" if fragment_mark else head


def userinfo_refusal(url: str, instead: str) -> str | None:
    """Why a URL that names a user (`scheme://user:password@host/...`) is refused, or None when it names none:
    the spec is kept in the experiment's ConfigMap, which the `view` role reads. The message shows the URL
    without its credentials (and redacted) and says where they go instead."""
    shown = redact_url(url)
    scheme, marks, rest = shown.partition("://")
    authority, slash, path = rest.partition("/")
    if not marks or "@" not in authority:
        return None
    return (
        f"'{scheme}://{authority.rsplit('@', 1)[-1]}{slash}{path}' carries credentials (user:password@), which "
        f"would be kept in the experiment's ConfigMap; {instead}"
    )


_URL_CREDENTIALS = "put them in a Secret and name its key in authorizationSecret (sent as the Authorization header)"


class ModelSource(SpecModel):
    """Where a model that is not built in comes from: exactly one of url, path and pvc."""

    url: str | None = Field(default=None, description="http(s) URL of the model file, archive or tarless folder.")
    path: str | None = Field(default=None, description="Local runs only: a file or no-archive folder on this machine.")
    pvc: VolumePath | None = Field(default=None, description="Kubernetes only: a file or folder on a claim.")
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Expected sha256 of the file (lowercase hex), checked before serving; unset: recorded only.",
    )
    format: ModelFormat = ModelFormat.AUTO
    authorization_secret: SecretKeyRef | None = Field(
        default=None,
        description="https url only: a Secret key whose value is sent as the Authorization header to the url's "
        "host alone (mounted only into the fetching init container; on Kubernetes the operator's "
        "modelCredentials must allow the Secret key for that host).",
    )
    max_bytes: int = Field(
        default=MODEL_MAX_BYTES_DEFAULT,
        ge=1,
        le=MODEL_MAX_BYTES_LIMIT,
        description="The most bytes the model may take on disk: the download, the file, or an archive or folder "
        "unpacked (counted as written). Sizes the server pod's model store.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        given = [name for name in ("url", "path", "pvc") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"set exactly one of url, path, pvc (got {', '.join(given) or 'none'})")
        if self.url is not None and not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"url: '{redact_url(self.url)}' is not an http(s) URL")
        if self.url is not None and (refusal := userinfo_refusal(self.url, _URL_CREDENTIALS)):
            raise ValueError(f"url: {refusal}")
        if self.authorization_secret is not None and self.url is None:
            raise ValueError("authorizationSecret: only a url source sends credentials")
        if self.authorization_secret is not None and self.url is not None and not self.url.startswith("https://"):
            raise ValueError(
                f"authorizationSecret: credentials are sent over https only; url '{redact_url(self.url)}' is not https"
            )
        if self.sha256 is not None and self.format is ModelFormat.DIRECTORY:
            raise ValueError("sha256: a folder has no single digest; give it for a file (an archive, .pt, .pt2)")
        return self

    def with_url(self, url: str) -> ModelSource:
        """This source with its whole URL back: the experiment's ConfigMap keeps it redacted
        (:func:`redact_url`), the init container gets the whole one from a Secret. ValueError when `url`
        is not the one this source was redacted from."""
        if self.url is None or redact_url(url) != self.url:
            raise ValueError(f"url: '{redact_url(url)}' is not this source's url '{self.url}'")
        return self.model_copy(update={"url": url})

    def describe(self) -> str:
        """The source as it may be shown: a URL's query string redacted (see :func:`redact_url`)."""
        if self.url is not None:
            return redact_url(self.url)
        if self.pvc is not None:
            return f"pvc://{self.pvc.claim_name}/{self.pvc.path}"
        return str(self.path)


class ModelInput(SpecModel):
    """What one request decodes to for a model packed with servinglab's handler (TorchScript, .pt2, ONNX)."""

    kind: Literal["image", "tensor"] = Field(
        default="image",
        description="image: an encoded image, decoded and resized to size x size RGB; "
        "tensor: a .npy array or JSON list of `shape`, cast to `dtype`.",
    )
    size: int = Field(default=224, ge=8, le=4096, description="image: the side length the model takes.")
    shape: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=list, max_length=6, description="tensor: the shape of one sample (no batch dimension)."
    )
    dtype: Literal["float32", "float16", "bfloat16", "int64", "int32", "uint8"] = Field(
        default="float32", description="tensor: the element type the model takes at fp32 (floats follow precision)."
    )

    @model_validator(mode="after")
    def _tensor_has_shape(self) -> ModelInput:
        if self.kind == "tensor" and not self.shape:
            raise ValueError("kind tensor needs shape (one sample's dimensions, e.g. [16])")
        if self.kind == "image" and self.shape:
            raise ValueError("shape is for kind tensor; an image input takes size")
        return self


class ModelRef(SpecModel):
    """Which model to serve: a built-in demo model, or the user's own from a source."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")]
    source: ModelSource | None = Field(default=None, description="Unset: `name` must be a built-in model.")
    input: ModelInput | None = Field(
        default=None, description="TorchScript and exported programs: what a request decodes to. Default: image 224."
    )

    @model_validator(mode="before")
    @classmethod
    def _archive_was_renamed(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "archive" in data:
            raise ValueError(
                f"archive: replaced by source (url, path or pvc); write source: {{path: {data['archive']!r}}} "
                f"or source: {{url: ...}}"
            )
        return data

    @model_validator(mode="after")
    def _builtin_or_source(self) -> ModelRef:
        if self.source is None and self.name not in BUILTIN_MODELS:
            raise ValueError(
                f"'{self.name}' is not a built-in model ({', '.join(BUILTIN_MODELS)}); "
                "set model.source to serve your own"
            )
        if self.source is None and self.input is not None:
            raise ValueError("input: built-in models declare their own input; it is for a model.source")
        if self.source is not None and self.source.format in (ModelFormat.MAR, ModelFormat.DIRECTORY) and self.input:
            raise ValueError(
                "input: an archive's own handler decodes requests; input is for TorchScript, .pt2 and ONNX"
            )
        return self
