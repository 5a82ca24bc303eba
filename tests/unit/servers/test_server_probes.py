"""Each server's container is not restarted by the kubelet while it starts: a startup probe allows the whole
`server.startupTimeoutSeconds` (the operator's own limit, which ends the experiment as ServerNotReady) before
the liveness probe counts. Before, the liveness probe alone killed a server still loading after 60 s (TorchServe,
Triton: 30 s delay + 3 failures 10 s apart; LitServe after 40 s), though its workers may compile for minutes and
Triton opens its HTTP port only once its models have loaded."""

from __future__ import annotations

import pytest

from servinglab.api import parse_experiment
from servinglab.servers import get
from servinglab.servers.base import PodInputs
from support.manifests import experiment

INPUTS = PodInputs("x-config", "servinglab:1")


@pytest.mark.parametrize("kind", ["torchserve", "litserve", "triton"])
@pytest.mark.parametrize("startup", [60, 600, 1805])
def test_the_startup_probe_allows_the_whole_startup_timeout_before_liveness_counts(kind: str, startup: int) -> None:
    spec = parse_experiment(experiment("x", server={"kind": kind, "startupTimeoutSeconds": startup})).spec
    container = get(kind).pod(spec, INPUTS).containers[0]
    started, alive = container["startupProbe"], container["livenessProbe"]
    allowed = started["periodSeconds"] * started["failureThreshold"]
    assert startup < allowed <= startup + 2 * started["periodSeconds"], started
    check = {key: value for key, value in alive.items() if key not in ("periodSeconds", "failureThreshold")}
    assert check == {key: value for key, value in started.items() if key not in ("periodSeconds", "failureThreshold")}
    assert "initialDelaySeconds" not in alive  # the startup probe gates it
