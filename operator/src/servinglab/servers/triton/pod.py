"""Triton in a pod: config.pbtxt in the experiment's ConfigMap, the init container that lays the model's
repository entry out, the server container with its launcher and readiness, and the volumes (pure).

The init container (`model`, the servinglab image) builds the built-in model from its seeded code (`servinglab
build-model NAME --into /models/NAME --server triton`: the build is copied, checked against its digests and
laid out beside servinglab's Python model) and drops in the experiment's config.pbtxt; with a model cache
claim it keeps builds there (mounted into it alone). The server container (the Triton image hack/images.sh
builds) runs `servinglab-tritonserver`, the Triton environment's launcher, over the read-only repository:
HTTP and metrics on all interfaces, gRPC off, and no model control (`--model-control-mode=none`): a pod
serves one configuration, so Triton loads the repository's one model at start and refuses every load and
unload through its repository API (HTTP 503), which is on the inference port the Service exposes: nobody
who reaches that port can load other code or quietly reload the model with other settings (the load Job
also reads the configuration back before it sends load). It is ready when Triton says the model is READY
(every instance loaded); a model Triton cannot load ends the container with the termination message
"ModelLoadFailed: <Triton's reason>". Non-root, read-only root file system, every emptyDir bounded.
"""

from __future__ import annotations

from servinglab.api import ExperimentSpec
from servinglab.servers.base import Manifest, PodInputs, PodPlan, liveness_probes, restricted, size_limit
from servinglab.servers.podparts import model_bytes, model_init_containers, model_volumes
from servinglab.servers.triton.config import VERSION, render_config
from servinglab.servers.triton.repository import BUILD_DIR, CONFIG_FILE
from servinglab.servers.triton.wire import MODEL_LOAD_FAILED

INFERENCE_PORT = 8000
METRICS_PORT = 8002
REPOSITORY = "/models"
CONFIG_DIR = "/etc/triton"
#: The launcher's copy of Triton's output, read when Triton ends (on the /tmp emptyDir).
SERVER_LOG = "/tmp/tritonserver.log"
#: uid of the servinglab images' user
TRITON_UID = 65532

_GI = 2**30
#: /tmp: the launcher's copy of the log, the stubs' scratch.
TMP_BYTES = _GI
#: /dev/shm: the Python backend's stubs exchange every batch's tensors with Triton there.
SHM_BYTES = 2 * _GI


def config_pbtxt(spec: ExperimentSpec) -> str:
    return render_config(spec.model.name, spec.server, spec.server.gpus, spec.load, spec.model.source is not None)


def server_launcher(model: str, log: str = SERVER_LOG, termination_log: str = "/dev/termination-log") -> str:
    """A POSIX sh script for the server container: runs `"$0" "$@"` (the launcher and Triton's options), its
    output both to the container's log and to `log`; when Triton ends with an error because it cannot load
    the model, the termination message is "ModelLoadFailed: <the reason Triton logged>". As PID 1 it passes
    SIGTERM on to the whole process group."""
    return f"""\
stop() {{ trap '' TERM INT; kill -TERM 0; wait; }}
trap 'stop; exit 143' TERM INT
rm -f '{log}.code'
{{ "$0" "$@" 2>&1; echo $? > '{log}.code'; }} | tee '{log}' &
wait $!
code=$(cat '{log}.code' 2>/dev/null || echo 1)
if [ "$code" -ne 0 ]; then
  cause=$(grep -m 1 "failed to load '{model}'" '{log}' | sed 's/.*failed to load [^:]*: //; s/\\\\n.*//; s/"$//')
  [ -n "$cause" ] && printf '{MODEL_LOAD_FAILED}: Triton could not load {model}: %s' "$cause" > '{termination_log}'
fi
exit "$code"
"""


def server_container(spec: ExperimentSpec, image: str, resources: Manifest) -> Manifest:
    model, gpus = spec.model.name, spec.server.gpus
    return {
        "name": "triton",
        "image": image,
        "command": ["sh", "-c", server_launcher(model)],
        "args": [
            "servinglab-tritonserver",
            f"--model-repository={REPOSITORY}",
            # the repository API is on the exposed inference port: no loads through it
            "--model-control-mode=none",
            "--strict-readiness=true",
            "--disable-auto-complete-config",
            f"--http-port={INFERENCE_PORT}",
            "--allow-grpc=false",
            f"--metrics-port={METRICS_PORT}",
            f"--allow-gpu-metrics={'true' if gpus else 'false'}",
            *([] if gpus else ["--pinned-memory-pool-byte-size=0"]),
            "--exit-timeout-secs=10",
        ],
        "env": [{"name": "TMPDIR", "value": "/tmp"}],
        "ports": [
            {"name": "inference", "containerPort": INFERENCE_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        # READY once every instance has loaded the model (strict readiness)
        "readinessProbe": {
            "httpGet": {"path": f"/v2/models/{model}/ready", "port": "inference"},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        # Triton opens its HTTP port once every model has loaded (and warmed up): the startup probe waits for it
        **liveness_probes(
            {"httpGet": {"path": "/v2/health/live", "port": "inference"}}, spec.server.startup_timeout_seconds
        ),
        "resources": resources,
        "volumeMounts": [
            {"name": "model-store", "mountPath": REPOSITORY, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        "securityContext": restricted(),
    }


def plan(spec: ExperimentSpec, inputs: PodInputs, image: str, resources: Manifest) -> PodPlan:
    # the model store sized for the model (a user's: its maxBytes), the probe's /tmp and the claims as needed
    volumes: list[Manifest] = [
        {"name": "config", "configMap": {"name": inputs.config_map}},
        *model_volumes(spec, inputs.model_cache_claim),
        {"name": "tmp", "emptyDir": {"sizeLimit": size_limit(TMP_BYTES + model_bytes(spec))}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size_limit(SHM_BYTES)}},
    ]
    return PodPlan(
        config_files={CONFIG_FILE: config_pbtxt(spec)},
        config_dir=CONFIG_DIR,
        # the shared model init containers (a user's model is counted where it lies: 1/build), the first of
        # which drops config.pbtxt beside the model
        init_containers=model_init_containers(
            spec,
            inputs,
            REPOSITORY,
            CONFIG_DIR,
            then=f"cp {CONFIG_DIR}/{CONFIG_FILE} {REPOSITORY}/{spec.model.name}/{CONFIG_FILE}\n",
            packed=f"{VERSION}/{BUILD_DIR}",
        ),
        containers=[server_container(spec, image, resources)],
        volumes=volumes,
        run_as_user=TRITON_UID,
        inference_port=INFERENCE_PORT,
        metrics_port=METRICS_PORT,
        metrics_path="/metrics",
    )
