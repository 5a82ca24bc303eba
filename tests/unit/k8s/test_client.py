"""Which API errors end an experiment as Rejected (the same request would be refused again) and which
the operator retries: a server not reached, a server error, and the refusals that pass on their own."""

from __future__ import annotations

import pytest

from servinglab.k8s.client import Forbidden, Invalid, KubeError, NotFound

# what kube-apiserver 1.36 answers, word for word, while its discovery cache lacks a new CRD's kind
UNMAPPED_OWNER = (
    'create Deployment ns/e-server: deployments.apps "e-server" is forbidden: cannot set blockOwnerDeletion in '
    "this case because cannot find RESTMapping for APIVersion servinglab.dev/v1alpha1 Kind ServingExperiment: "
    'no matches for kind "ServingExperiment" in version "servinglab.dev/v1alpha1"'
)


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        (Forbidden('create Deployment ns/e-server: User "x" cannot create resource "deployments"', 403), True),
        (Forbidden("create Job ns/e-load: exceeded quota: gpu, requested: requests.nvidia.com/gpu=1", 403), True),
        (Invalid("apply Deployment ns/e-server: spec.template.spec.containers[0].image: Required value", 422), True),
        (NotFound('apply Job ns/e-load: namespaces "ns" not found', 404), True),
        (Forbidden(UNMAPPED_OWNER, 403), False),
        (KubeError("apply Deployment ns/e-server: Internal error", 500), False),
        (KubeError("apply Deployment ns/e-server: connection refused", 0), False),
    ],
)
def test_only_a_lasting_refusal_counts_as_one(error: KubeError, refused: bool) -> None:
    assert error.refusal is refused
