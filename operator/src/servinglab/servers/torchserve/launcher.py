"""What a TorchServe that cannot load its model looks like, and the launcher that watches for it.

TorchServe retries a model whose handler fails to load for ever, and its /ping answers Healthy before any
worker has the model. The local server (:mod:`.local`) reads the model log itself (:mod:`.logs`); a
server container runs TorchServe under :func:`server_launcher`, which says when the model is loaded and
ends the container with the reason when it cannot be.
"""

from __future__ import annotations

#: The reason a server container ends with when its workers cannot load the model (its termination message
#: starts "ModelLoadFailed: ").
MODEL_LOAD_FAILED = "ModelLoadFailed"

#: What a TorchServe worker logs when the handler's initialize() raised.
LOAD_FAILED = "Failed to load model "
#: What TorchServe's frontend logs when a worker died while loading the model (the handler failed to import,
#: before initialize() could say why); the cause is then the last exception line in the model log.
WORKER_DIED = "Load model failed: {model}, error: Worker died."
#: Attempts seen before giving up (TorchServe retries a failed worker for ever, with a growing back-off).
LOAD_ATTEMPTS = 2
#: The exit code of a server container that gave up on its model.
LOAD_FAILED_EXIT_CODE = 3
#: What a worker's exception says when the model does not fit the GPU's memory (torch's OutOfMemoryError,
#: a CUDA allocation failing), as it reaches the termination message.
OUT_OF_MEMORY_SIGNS = ("CUDA out of memory", "OutOfMemoryError", "CUDA error: out of memory")


def out_of_memory(cause: str) -> bool:
    """Whether a worker's failure to load the model was the GPU running out of memory."""
    return any(sign.lower() in cause.lower() for sign in OUT_OF_MEMORY_SIGNS)


def server_launcher(
    model: str, workers: int, logs: str, ready_file: str, termination_log: str = "/dev/termination-log"
) -> str:
    """A POSIX sh script for a server container: runs `torchserve "$@"` and watches TorchServe's logs in
    `logs` (only what this start wrote: the folder outlives a container restart).

    * Ready: `ready_file` exists once `workers` workers have loaded the model. TorchServe's /ping is no
      readiness check: it answers Healthy as soon as the frontend is up, seconds before any worker has
      loaded the model, and for a while even when every worker fails to load it.
    * Given up: TorchServe retries a model whose handler fails to load for ever (the pod would sit
      unready until the start-up timeout), so after LOAD_ATTEMPTS failures the container ends with
      exit code 3 and the termination message "ModelLoadFailed: <the handler's last exception>".

    Once ready it only waits: nothing scans logs while the server is measured. As the container's
    PID 1 it passes SIGTERM on to the whole process group (PID 1 ignores signals
    it has no handler for)."""
    marker = LOAD_FAILED
    loaded = f"W-[0-9]*-{model}_[^ ]* State change WORKER_STARTED -> WORKER_MODEL_LOADED"
    died = WORKER_DIED.format(model=model)
    return f"""\
size() {{ {{ wc -c < "$1"; }} 2>/dev/null || echo 0; }}
since() {{ tail -c "+$(( $2 + 1 ))" "$1" 2>/dev/null; }}
stop() {{ trap '' TERM INT; kill -TERM 0; wait; }}
trap 'stop; exit 143' TERM INT
rm -f '{ready_file}'
ts_start=$(size '{logs}/ts_log.log')
model_start=$(size '{logs}/model_log.log')
torchserve "$@" &
server=$!
while [ ! -f '{ready_file}' ] && kill -0 "$server" 2>/dev/null; do
  workers=$(since '{logs}/ts_log.log' "$ts_start" | grep -o '{loaded}' | sort -u | wc -l)
  [ "$workers" -ge {workers} ] && : > '{ready_file}'
  failures=$(since '{logs}/model_log.log' "$model_start" | grep -c '{marker}')
  died=$(since '{logs}/ts_log.log' "$ts_start" | grep -cF '{died}')
  if [ "$died" -ge {LOAD_ATTEMPTS} ] && [ "$failures" -lt {LOAD_ATTEMPTS} ]; then
    failures=$died
    cause=$(since '{logs}/model_log.log' "$model_start" | grep -E 'MODEL_LOG - [A-Za-z_.]*(Error|Exception): ' \\
      | tail -n 1 | sed 's/.*MODEL_LOG - //')
  else
    cause=$(since '{logs}/model_log.log' "$model_start" | grep '{marker}' | tail -n 1 \\
      | sed 's/.*{marker}//; s/^[^,]*, exception //')
  fi
  if [ "$failures" -ge {LOAD_ATTEMPTS} ]; then
    message="TorchServe's workers could not load {model} ($failures attempts): $cause"
    printf '{MODEL_LOAD_FAILED}: %s' "$message" > '{termination_log}'
    stop
    exit {LOAD_FAILED_EXIT_CODE}
  fi
  sleep 0.5
done
wait "$server"
"""
