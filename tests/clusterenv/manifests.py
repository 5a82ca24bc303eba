"""Objects the test cluster is seeded with: simulated nodes and KWOK stages (pure builders).

GPU nodes look like what NVIDIA's device plugin and GPU feature discovery publish on a T4 node:
`nvidia.com/gpu` capacity, `nvidia.com/gpu.product=Tesla-T4` and friends, and the
`nvidia.com/gpu:NoSchedule` taint. KWOK manages only nodes annotated `kwok.x-k8s.io/node: fake`.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
#: Pod annotations read by the job-completion stage (set on the pod template or patched later).
EXIT_CODE_ANNOTATION = "kwok.servinglab.dev/exit-code"
MESSAGE_ANNOTATION = "kwok.servinglab.dev/message"
REASON_ANNOTATION = "kwok.servinglab.dev/reason"


def node(name: str, gpus: int = 0, product: str = "Tesla-T4", cpu: str = "8", memory: str = "32Gi") -> dict[str, Any]:
    labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        "type": "kwok",
    }
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    taints: list[dict[str, str]] = []
    if gpus:
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.memory": "15360",
            "nvidia.com/gpu.family": "turing",
        }
        capacity["nvidia.com/gpu"] = str(gpus)
        taints.append({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {KWOK_NODE_ANNOTATION: "fake"}},
        "spec": {"providerID": f"kwok://{name}", "taints": taints},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            # every NodeSystemInfo field is required by the schema; KWOK fills in what matters
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                **dict.fromkeys(
                    (
                        "machineID",
                        "systemUUID",
                        "bootID",
                        "kernelVersion",
                        "osImage",
                        "containerRuntimeVersion",
                        "kubeProxyVersion",
                    ),
                    "",
                ),  # fmt: skip
            },
        },
    }


def default_nodes() -> list[dict[str, Any]]:
    """Two single-T4 GPU nodes and one CPU-only node."""
    return [node("gpu-t4-0", gpus=1), node("gpu-t4-1", gpus=1), node("cpu-0")]


# Replaces KWOK's default pod-complete stage: a Job's pod finishes only when it carries the
# exit-code annotation (on its template, or patched on later by a test that ran the real work),
# with that exit code, reason and termination message; phase Failed for a non-zero code.
JOB_POD_COMPLETE_STAGE = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values: ['Job']
    - key: '.metadata.annotations["{EXIT_CODE_ANNOTATION}"]'
      operator: 'Exists'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $ann := .metadata.annotations }}}}
      {{{{ $exitCode := index $ann "{EXIT_CODE_ANNOTATION}" }}}}
      {{{{ $message := or ( index $ann "{MESSAGE_ANNOTATION}" ) "" }}}}
      {{{{ $reason := "Completed" }}}}
      {{{{ if ne $exitCode "0" }}}}{{{{ $reason = "Error" }}}}{{{{ end }}}}
      {{{{ $reason = or ( index $ann "{REASON_ANNOTATION}" ) $reason }}}}
      containerStatuses:
      {{{{ range $index, $item := .spec.containers }}}}
      - image: {{{{ $item.image | Quote }}}}
        name: {{{{ $item.name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: {{{{ $exitCode }}}}
            reason: {{{{ $reason | Quote }}}}
            message: {{{{ $message | Quote }}}}
            startedAt: {{{{ $now | Quote }}}}
            finishedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      conditions:
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: Ready
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: ContainersReady
      phase: {{{{ if eq $exitCode "0" }}}}Succeeded{{{{ else }}}}Failed{{{{ end }}}}
"""


def kubeconfig(server: str, ca_cert: Path, client_cert: Path, client_key: Path, name: str = "servinglab-test") -> str:
    """A kubeconfig with the CA and client credentials embedded (JSON is valid YAML)."""

    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": b64(ca_cert)}}],
        "users": [
            {
                "name": name,
                "user": {"client-certificate-data": b64(client_cert), "client-key-data": b64(client_key)},
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}],
        "current-context": name,
    }
    return json.dumps(config, indent=2)
