"""Which Secrets may be sent as model credentials, and to which hosts: the platform's opt-in.

An experiment's `spec.model.source.authorizationSecret` names a Secret key whose value the server pod's
init container sends as the Authorization header. Without a check, anyone allowed to create a
ServingExperiment could send any Secret of the namespace to a host of their choosing. So the operator uses
a Secret key only where the chart's `modelCredentials` lists it (the SERVINGLAB_MODEL_CREDENTIALS
environment variable, JSON), and only for the hosts listed with it; it checks this before it creates
anything, from the spec alone (it needs no `get` on Secrets). Pure functions: the operator calls
:func:`from_env` once and :func:`problems` for each experiment.
"""

from __future__ import annotations

import json
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from servinglab.api import ExperimentSpec

ENV = "SERVINGLAB_MODEL_CREDENTIALS"
_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_HOST = r"^(\*\.)?[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$"


class AllowedCredential(BaseModel):
    """One Secret key that may be sent, to these hosts, from these namespaces (default: every watched one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    secret: Annotated[str, Field(min_length=1, max_length=253, pattern=_NAME)]
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]
    hosts: tuple[Annotated[str, Field(min_length=1, max_length=253, pattern=_HOST)], ...] = Field(min_length=1)
    namespaces: tuple[Annotated[str, Field(min_length=1, max_length=63, pattern=_NAME)], ...] = ()

    def allows_host(self, host: str) -> bool:
        """`host` is listed, or under a listed `*.domain` (a subdomain of it, not the domain itself)."""
        host = host.lower()
        return any(
            host.endswith(allowed[1:].lower()) if allowed.startswith("*.") else host == allowed.lower()
            for allowed in self.hosts
        )


_ALLOWED = TypeAdapter(tuple[AllowedCredential, ...])


def parse(text: str) -> tuple[AllowedCredential, ...]:
    """The allowed credentials from their JSON; ValueError naming the entry and field when it is not that."""
    if not text.strip():
        return ()
    try:
        return _ALLOWED.validate_python(json.loads(text))
    except ValueError as exc:  # pydantic's ValidationError is one too
        if isinstance(exc, ValidationError):
            detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        else:
            detail = str(exc)
        what = f"{ENV} (the chart's modelCredentials)"
        raise ValueError(f"{what} is not a list of {{secret, key, hosts}}: {detail}") from None


def problems(spec: ExperimentSpec, namespace: str, allowed: tuple[AllowedCredential, ...]) -> list[str]:
    """Why this experiment may not send the credentials it names (nothing when it names none, or may)."""
    source = spec.model.source
    if source is None or source.authorization_secret is None or source.url is None:
        return []
    secret = source.authorization_secret
    named = f"Secret {secret.name} key {secret.key}"
    host = urlsplit(source.url).hostname or ""
    entries = [
        entry
        for entry in allowed
        if (entry.secret, entry.key) == (secret.name, secret.key)
        and (not entry.namespaces or namespace in entry.namespaces)
    ]
    field = "spec.model.source.authorizationSecret"
    if not entries:
        return [
            f"{field}: {named} is not allowed as model credentials in namespace {namespace}; the operator's "
            "modelCredentials (a chart value) must list it, with the hosts it may be sent to"
        ]
    if not any(entry.allows_host(host) for entry in entries):
        hosts = sorted({h for entry in entries for h in entry.hosts})
        return [f"{field}: {named} may be sent to {', '.join(hosts)} only, not to host {host} of spec.model.source.url"]
    return []
