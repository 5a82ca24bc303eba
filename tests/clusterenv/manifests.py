"""Objects the test cluster is seeded with: simulated nodes and KWOK stages (pure builders).

GPU nodes look like what NVIDIA's device plugin and GPU feature discovery publish on a T4 node:
`nvidia.com/gpu` capacity, `nvidia.com/gpu.product=Tesla-T4` and friends, and the
`nvidia.com/gpu:NoSchedule` taint. KWOK manages only nodes annotated `kwok.x-k8s.io/node: fake`.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
#: Pod annotations read by the job-completion stage (set on the pod template or patched later).
EXIT_CODE_ANNOTATION = "kwok.servinglab.dev/exit-code"
MESSAGE_ANNOTATION = "kwok.servinglab.dev/message"
REASON_ANNOTATION = "kwok.servinglab.dev/reason"
#: An init container's exit code and termination message, as the stand-in kubelet reports them.
INIT_EXIT_CODE_ANNOTATION = "kwok.servinglab.dev/init-exit-code"
INIT_MESSAGE_ANNOTATION = "kwok.servinglab.dev/init-message"
#: A pod whose status the stand-in kubelet writes itself (one that cannot start, evicted, killed for memory):
#: KWOK's stages leave it alone (but for its deletion).
KUBELET_STATUS_ANNOTATION = "kwok.servinglab.dev/status-by-kubelet"


def init_message_annotation(container: str) -> str:
    """The annotation carrying one init container's termination message (a pod may have several)."""
    return f"{INIT_MESSAGE_ANNOTATION}.{container}"


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
                ),
            },
        },
    }


def bound_claim(namespace: str, name: str, access: str = "ReadWriteMany") -> list[dict[str, Any]]:
    """A PersistentVolumeClaim and the volume it binds to (the stand-in kubelet mounts it as a folder)."""
    volume = f"{namespace}-{name}"
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": [access], "storageClassName": "",
                  "hostPath": {"path": f"/srv/{volume}"}, "persistentVolumeReclaimPolicy": "Retain"}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
         "spec": {"accessModes": [access], "storageClassName": "", "volumeName": volume,
                  "resources": {"requests": {"storage": "1Gi"}}}},
    ]  # fmt: skip


def default_nodes() -> list[dict[str, Any]]:
    """Two single-T4 GPU nodes and one CPU-only node."""
    return [node("gpu-t4-0", gpus=1), node("gpu-t4-1", gpus=1), node("cpu-0")]


# Replaces KWOK's default pod-complete stage: a pod (a Job's, or a bare one such as a `helm test`
# hook) finishes only when it carries the exit-code annotation (on its template, or patched on later
# by a test that ran the real work), with that exit code, reason and termination message; phase
# Failed for a non-zero code.
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


POD_INIT_FAILED_STAGE = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-init-failed
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
    - key: '.metadata.annotations["{INIT_EXIT_CODE_ANNOTATION}"]'
      operator: 'Exists'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $ann := .metadata.annotations }}}}
      {{{{ $exitCode := index $ann "{INIT_EXIT_CODE_ANNOTATION}" }}}}
      {{{{ $message := or ( index $ann "{INIT_MESSAGE_ANNOTATION}" ) "" }}}}
      initContainerStatuses:
      {{{{ range $index, $item := .spec.initContainers }}}}
      - image: {{{{ $item.image | Quote }}}}
        name: {{{{ $item.name | Quote }}}}
        ready: false
        restartCount: 1
        started: false
        state:
          waiting:
            reason: CrashLoopBackOff
            message: back-off restarting failed container
        lastState:
          terminated:
            exitCode: {{{{ $exitCode }}}}
            reason: Error
            message: {{{{ $message | Quote }}}}
            startedAt: {{{{ $now | Quote }}}}
            finishedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      containerStatuses:
      {{{{ range $index, $item := .spec.containers }}}}
      - image: {{{{ $item.image | Quote }}}}
        name: {{{{ $item.name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          waiting:
            reason: PodInitializing
      {{{{ end }}}}
      conditions:
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: Initialized
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: Ready
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: ContainersReady
      phase: Pending
"""
"""A kubelet's report of an init container that failed: the pod is back to Pending, the init container
waits to be restarted, and its last termination carries the exit code and message."""


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


READY_ANNOTATION = "kwok.servinglab.dev/ready"
_NO_PROBE = {"key": ".spec.containers.[].readinessProbe", "operator": "DoesNotExist"}
_HAS_PROBE = {"key": ".spec.containers.[].readinessProbe", "operator": "Exists"}


def probe_aware_pod_stages(shipped_pod_ready: str) -> list[str]:
    """KWOK's pod-ready stage split the way a kubelet behaves with readiness probes.

    Pods without a readiness probe become Ready at once (KWOK's default). Pods with one start
    Running but not Ready, and become Ready only once annotated `kwok.servinglab.dev/ready: "true"`
    — which the test harness does after probing the real process it started for the pod.
    """
    base = yaml.safe_load(shipped_pod_ready)
    # a pod whose init container failed stays Pending (see POD_INIT_FAILED_STAGE), as does one the stand-in
    # kubelet reports itself (KUBELET_STATUS_ANNOTATION)
    base["spec"]["selector"]["matchExpressions"] += [
        {"key": f'.metadata.annotations["{INIT_EXIT_CODE_ANNOTATION}"]', "operator": "DoesNotExist"},
        {"key": f'.metadata.annotations["{KUBELET_STATUS_ANNOTATION}"]', "operator": "DoesNotExist"},
    ]
    stages = []

    without_probe = copy.deepcopy(base)
    without_probe["spec"]["selector"]["matchExpressions"].append(_NO_PROBE)
    stages.append(without_probe)

    started = copy.deepcopy(base)
    started["metadata"]["name"] = "pod-start-unready"
    started["spec"]["selector"]["matchExpressions"].append(_HAS_PROBE)
    template = started["spec"]["next"]["statusTemplate"]
    template = re.sub(r'status: "True"(\s+)type: (Ready|ContainersReady)\b', r'status: "False"\1type: \2', template)
    # the first `ready: true` is in containerStatuses (init containers follow and do finish)
    started["spec"]["next"]["statusTemplate"] = template.replace("ready: true", "ready: false", 1)
    stages.append(started)

    probed = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": "pod-probe-ready"},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {
                "matchExpressions": [
                    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                    {"key": f'.metadata.annotations["{KUBELET_STATUS_ANNOTATION}"]', "operator": "DoesNotExist"},
                    {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                    _HAS_PROBE,
                    {"key": f'.metadata.annotations["{READY_ANNOTATION}"]', "operator": "In", "values": ["true"]},
                    {
                        "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                        "operator": "NotIn",
                        "values": ["True"],
                    },
                ]
            },
            "next": {
                "statusTemplate": (
                    "{{ $now := Now }}\n"
                    "conditions:\n"
                    '- lastTransitionTime: {{ $now | Quote }}\n  status: "True"\n  type: Ready\n'
                    '- lastTransitionTime: {{ $now | Quote }}\n  status: "True"\n  type: ContainersReady\n'
                    f'{{{{ $init := or ( index .metadata.annotations "{INIT_MESSAGE_ANNOTATION}" ) "" }}}}\n'
                    "initContainerStatuses:\n"
                    "{{ range .status.initContainerStatuses }}\n"
                    f'{{{{ $own := index $.metadata.annotations (printf "{INIT_MESSAGE_ANNOTATION}.%s" .name) }}}}\n'
                    "- name: {{ .name | Quote }}\n  image: {{ .image | Quote }}\n  ready: true\n"
                    "  restartCount: {{ .restartCount }}\n"
                    "  state:\n    terminated:\n      exitCode: 0\n      reason: Completed\n"
                    "      message: {{ or $own $init | Quote }}\n"
                    "      startedAt: {{ $now | Quote }}\n      finishedAt: {{ $now | Quote }}\n"
                    "{{ end }}\n"
                    "containerStatuses:\n"
                    "{{ range .status.containerStatuses }}\n"
                    "- name: {{ .name | Quote }}\n  image: {{ .image | Quote }}\n  ready: true\n"
                    "  restartCount: {{ .restartCount }}\n"
                    "  state:\n    running:\n      startedAt: {{ $now | Quote }}\n"
                    "{{ end }}\n"
                )
            },
        },
    }
    stages.append(probed)
    return [yaml.safe_dump(stage, sort_keys=False) for stage in stages]
