#!/usr/bin/env bash
# Build servinglab's images with docker when there is one, else podman, and print their names:
#   servinglab/operator:<version>     operator/Dockerfile          (the Helm chart's operator)
#   servinglab/servinglab:<version>   loadtests/Dockerfile         (load Job, model-builder init container)
#   servinglab/triton:<version>       hack/images/triton/          (Triton pods: the servinglab image + tritonserver)
#   servinglab/litserve:<version>     hack/images/litserve/        (LitServe servers: the servinglab image + litserve)
#                                     (these two only with SERVER_IMAGES=1, as `make images` sets)
#   pytorch/torchserve:0.12.0-gpu     hack/images/torchserve/      (a stand-in; only with STANDIN=1)
#   servinglab/pause:1                hack/images/pause/           (pod sandboxes; only with STANDIN=1)
# An image whose inputs (its files, build arguments and base) are unchanged is not rebuilt: each
# carries the hash of its inputs in the label dev.servinglab.inputs.
#
# Environment:
#   BASE_IMAGE        base of both images (default: the official python:3.11.11-slim-bookworm)
#   STANDIN=1         no registry: make the base from Debian's packages (debootstrap) and build the
#                     TorchServe stand-in too; what the test suite does
#   TORCH_INDEX_URL   where torch comes from (default: PyTorch's CPU index)
#   CA_BUNDLE         a CA bundle pip must trust (default: $PIP_CERT); given to the build as a secret,
#                     never copied into an image
#   IMAGE_ENGINE      docker or podman (default: docker if its daemon answers, else podman)
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[images %s] %s\n' "$(date +%T)" "$*" >&2; }
# One build at a time per machine: `make test` starts one in the background while the tests that need
# the images may ask for them too; the second waits, then finds them up to date.
lock_dir=${XDG_CACHE_HOME:-$HOME/.cache}/servinglab
mkdir -p "$lock_dir"
exec 9>"$lock_dir/images.lock"
flock 9

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
engine=${IMAGE_ENGINE:-}
if [[ -z $engine ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker
  elif command -v podman >/dev/null; then engine=podman
  else log "neither docker nor podman is installed"; exit 1; fi
fi
# podman: runc (crun refuses hybrid cgroup layouts) and explicit ulimits (its defaults can be refused);
# names are qualified with docker.io/ so that they are the names a kubelet asks for.
prefix=""
engine_cmd=("$engine")
build_flags=()
if [[ $engine == podman ]]; then
  prefix=docker.io/
  engine_cmd+=(--runtime runc)
  build_flags+=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --network host)
fi
ca=${CA_BUNDLE:-${PIP_CERT:-}}
[[ -n $ca ]] && build_flags+=(--secret "id=ca-bundle,src=$ca")
torch_args=()
[[ -n ${TORCH_INDEX_URL:-} ]] && torch_args=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")

label() { "${engine_cmd[@]}" image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }
image_id() { "${engine_cmd[@]}" image inspect --format '{{ .Id }}' "$1" 2>/dev/null || true; }

standin_base() { # a Debian bookworm base with Python 3.11 and pip on PATH (a venv), as the official image has
  local tag=localhost/servinglab/python-standin:3.11-bookworm root mirror
  if [[ -n $(image_id "$tag") ]]; then echo "$tag"; return; fi
  mirror=$(sed -n 's/^URIs: *\([^ ]*debian\)$/\1/p; s/^deb \(http[^ ]*debian\) .*/\1/p' \
    /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -1)
  root=$(mktemp -d)
  log "making $tag with debootstrap from ${mirror:=http://deb.debian.org/debian}"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror" >&2
  chroot "$root" python3 -m venv /usr/local/py
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | "${engine_cmd[@]}" import \
    --change 'ENV PATH=/usr/local/py/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$tag" >&2
  rm -rf "$root"
  echo "$tag"
}

build() { # NAME DOCKERFILE BASE_ID [BUILD ARG...] -- INPUT PATH...
  local name=$1 file=$2 base_id=$3 args=() hash
  shift 3
  while [[ $1 != -- ]]; do args+=("$1"); shift; done
  shift
  hash=$({ printf '%s\n' "${build_flags[*]}" "${args[*]}" "$base_id"
           git ls-files -co --exclude-standard -z -- "$file" "$@" | sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-16)
  if [[ $(label "$prefix$name" dev.servinglab.inputs) == "$hash" ]]; then
    log "$name is up to date ($hash)"
  else
    log "building $name"
    "${engine_cmd[@]}" build "${build_flags[@]}" "${args[@]}" --label "dev.servinglab.inputs=$hash" \
      -f "$file" -t "$prefix$name" . >&2
  fi
  echo "$prefix$name"
}

base_args=()
base=${BASE_IMAGE:-}
[[ ${STANDIN:-0} == 1 && -z $base ]] && base=$(standin_base)
base_id=""
if [[ -n $base ]]; then
  base_args=(--build-arg "BASE_IMAGE=$base")
  base_id=$(image_id "$base")
  [[ $engine == podman && -n $base_id ]] && base_args+=(--pull=never)
fi
common=(pyproject.toml README.md operator/src)
build "servinglab/operator:$version" operator/Dockerfile "$base_id" "${base_args[@]}" -- "${common[@]}"
servinglab=$(build "servinglab/servinglab:$version" loadtests/Dockerfile "$base_id" "${base_args[@]}" "${torch_args[@]}" -- \
  "${common[@]}" handlers model-store loadtests)
echo "$servinglab"
local_only=()
[[ $engine == podman ]] && local_only=(--pull=never)
# The other servers' images: the tests run Triton and LitServe pods on the stand-in kubelet, not from these
if [[ ${SERVER_IMAGES:-0} == 1 ]]; then
  build "servinglab/triton:$version" hack/images/triton/Dockerfile "$(image_id "$servinglab")" \
    --build-arg "SERVINGLAB_IMAGE=$servinglab" "${local_only[@]}" -- hack/images/triton \
    operator/src/servinglab/servers/triton/requirements.txt
  build "servinglab/litserve:$version" hack/images/litserve/Dockerfile "$(image_id "$servinglab")" \
    --build-arg "SERVINGLAB_IMAGE=$servinglab" "${local_only[@]}" -- hack/images/litserve
fi
if [[ ${STANDIN:-0} == 1 ]]; then
  build pytorch/torchserve:0.12.0-gpu hack/images/torchserve/Dockerfile "$(image_id "$servinglab")" \
    --build-arg "SERVINGLAB_IMAGE=$servinglab" "${local_only[@]}" -- hack/images/torchserve
  build servinglab/pause:1 hack/images/pause/Dockerfile "$base_id" "${base_args[@]}" -- hack/images/pause
fi
# the images these replaced (untagged now) would otherwise pile up, several GB each
"${engine_cmd[@]}" image prune -f --filter label=dev.servinglab.inputs >/dev/null
