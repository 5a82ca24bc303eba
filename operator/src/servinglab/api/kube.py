"""Kubernetes' own rules for values a spec hands to the API: label keys and values, quantities, resources,
and the container runtime's for image references.

The API server refuses a pod whose node selector, tolerations or resources break these rules; checked
here, such a spec is refused when it is read (naming the field), instead of by the API server mid-run.
Used by the server's spec (:mod:`servinglab.api.servers`) and the load's (:mod:`servinglab.api.load`).
"""

from __future__ import annotations

import re
from fractions import Fraction

from pydantic import Field, field_validator, model_validator

from servinglab.api.meta import SpecModel

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SCALE = {
    "": Fraction(1), "m": Fraction(1, 1000),
    **{suffix: Fraction(1000) ** (i + 1) for i, suffix in enumerate("kMGTPE")},
    **{f"{suffix}i": Fraction(1024) ** (i + 1) for i, suffix in enumerate("KMGTPE")},
}  # fmt: skip


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a label key (a qualified name: an optional DNS subdomain prefix and '/', then a
    name of at most 63 characters), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return f"'{key}': the prefix before '/' must be a DNS subdomain (lowercase, at most 253 characters)"
    if not name or len(name) > 63 or not _NAME.match(name):
        return (
            f"'{key}' is not a label key: a name of at most 63 letters, digits, '-', '_' and '.', starting and "
            "ending with a letter or digit, optionally after a 'prefix/'"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a label value (empty, or at most 63 letters, digits, '-', '_', '.'), or None."""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return (
            f"'{value}' is not a label value: at most 63 letters, digits, '-', '_' and '.', starting and ending "
            "with a letter or digit"
        )
    return None


#: An extended resource's name as the API server accepts it: a DNS subdomain prefix, a slash, a name.
_RESOURCE = re.compile(
    r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def resource_problem(name: str) -> str | None:
    """Why `name` cannot be the GPU resource (None if it can): a vendor's extended resource, such as
    nvidia.com/gpu, nvidia.com/mig-1g.5gb or amd.com/gpu."""
    if not _RESOURCE.match(name) or name.split("/", 1)[0].endswith("kubernetes.io"):
        return f"'{name}' is not an extended resource name such as nvidia.com/gpu or nvidia.com/mig-1g.5gb"
    return None


# The image reference grammar of the distribution project (docker/distribution's reference package), which
# the container runtimes parse with: [host[:port]/]path[:tag][@digest].
_HOST_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_HOST = re.compile(rf"^(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?$")
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
#: The digest algorithms the runtimes verify, and their length in (lowercase) hex digits.
_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
#: The longest repository name (host and path) the grammar allows.
_NAME_MAX = 255


def image_problem(reference: str) -> str | None:
    """Why `reference` is not a container image reference as the runtime parses it, or None: the registry
    host (with a port) when the first component has a '.' or ':' or is localhost, then path components of
    lowercase letters and digits joined by '.', '_', '__' or dashes, then a tag (at most 128 letters,
    digits, '_', '.', '-', not starting with '.' or '-') and/or a digest (algorithm:hex)."""
    rest, at, digest = reference.partition("@")
    last_slash = rest.rfind("/")
    name, colon, tag = rest.rpartition(":") if rest.rfind(":") > last_slash else (rest, "", "")
    components = name.split("/")
    host = components[0] if len(components) > 1 and (
        "." in components[0] or ":" in components[0] or components[0] == "localhost"
    ) else None  # fmt: skip
    path = components[1:] if host is not None else components
    if not name:
        return f"'{reference}' is not an image reference: it names no repository"
    if host is not None and not _HOST.match(host):
        return f"'{reference}': '{host}' is not a registry host[:port]"
    for component in path:
        if not _COMPONENT.match(component):
            what = "an empty path component" if not component else f"the path component '{component}'"
            return (
                f"'{reference}': {what} is not lowercase letters and digits joined by '.', '_', '__' or '-' "
                "(the runtime would refuse to pull it)"
            )
    if len(name) > _NAME_MAX:
        return f"'{reference}': the repository name is {len(name)} characters, above the limit of {_NAME_MAX}"
    if colon and not _TAG.match(tag):
        return (
            f"'{reference}': the tag '{tag}' is not 1 to 128 letters, digits, '_', '.' and '-' (not starting with "
            "'.' or '-')"
        )
    if at:
        algorithm, _, hex_part = digest.partition(":")
        wanted = _DIGEST_HEX.get(algorithm)
        if wanted is None or len(hex_part) != wanted or not re.fullmatch(r"[0-9a-f]+", hex_part):
            return (
                f"'{reference}': '{digest}' is not a digest: sha256, sha384 or sha512, ':' and its lowercase hex "
                "(64, 96 or 128 digits)"
            )
    return None


def quantity(text: str) -> Fraction:
    """A Kubernetes quantity ("500m", "2", "1.5Gi") as an exact number; ValueError if it is not one."""
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"'{text}' is not a Kubernetes quantity")
    return Fraction(match.group(1)) * _SCALE[match.group(3) or ""]


class Resources(SpecModel):
    """CPU/memory requests and limits of a container; each request at most its limit, as the API demands."""

    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, value: dict[str, str]) -> dict[str, str]:
        for name, amount in value.items():
            if name not in ("cpu", "memory", "ephemeral-storage"):
                raise ValueError(f"'{name}' is not one of cpu, memory, ephemeral-storage")
            if not _QUANTITY.match(str(amount)):
                raise ValueError(f"{name}: '{amount}' is not a Kubernetes quantity")
        return value

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        for name, request in self.requests.items():
            limit = self.limits.get(name)
            if limit is not None and quantity(request) > quantity(limit):
                raise ValueError(f"requests.{name} '{request}' is above limits.{name} '{limit}'")
        return self

    def manifest(self) -> dict[str, dict[str, str]]:
        """As a container's `resources` (only the parts given)."""
        return {part: dict(values) for part, values in (("requests", self.requests), ("limits", self.limits)) if values}
