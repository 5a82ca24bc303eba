#!/usr/bin/env bash
# Build the binaries of the test control plane from Go modules (no release downloads, no Docker):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl   <- k8s.io/kubernetes
#   kubelet, kube-proxy (the real node that runs pods as containers)   <- k8s.io/kubernetes
#   etcd                                                               <- go.etcd.io/etcd/server/v3
#   kwok (+ its stage YAMLs)                                           <- sigs.k8s.io/kwok
#   helm                                                               <- helm.sh/helm/v3
#   coredns (cluster DNS for the real node)                            <- github.com/coredns/coredns
#   ServiceMonitor/PodMonitor CRDs                       <- github.com/prometheus-operator/prometheus-operator
# into a cache directory outside the repo keyed by the versions in hack/control-plane.env, and
# print that directory. A complete cache returns at once; a partial one builds what is missing.
# Two parts: `cluster` is what a cluster of simulated nodes and the chart's tests need; `node` is the real
# node's kubelet, kube-proxy and CoreDNS, which only the real-node tests use (their own session), so a cold
# `make test` starts the cluster tests without waiting for them. One build at a time per cache (a lock):
# a second caller waits, then finds the binaries built.
#
#   hack/build-control-plane.sh [all]      # build or reuse both parts; prints the bin directory
#   hack/build-control-plane.sh cluster    # only what a cluster of simulated nodes needs
#   hack/build-control-plane.sh node       # only the real node's binaries
#   SERVINGLAB_K8S_CACHE=/path ...         # cache root (default ~/.cache/servinglab/control-plane)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=control-plane.env
source "$here/control-plane.env"
cache_root=${SERVINGLAB_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servinglab/control-plane}
bin="$cache_root/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"

part=${1:-all}
case $part in
  all) parts=(cluster node) ;;
  cluster | node) parts=("$part") ;;
  *) echo "usage: $0 [all|cluster|node] (got: $part)" >&2; exit 2 ;;
esac
part_complete() { # PART: its binaries are there and were checked (a marker per part, written last; the
  # versions outside the cache's name are checked by their own files)
  case $1 in
    cluster) [[ -f "$bin/.complete-cluster" && -d "$bin/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION" ]] ;;
    node) [[ -f "$bin/.complete-node" && -x "$bin/coredns-$COREDNS_VERSION" ]] ;;
    *) return 1 ;;
  esac
}
built() { # every part asked for is complete
  local part
  for part in "${parts[@]}"; do part_complete "$part" || return 1; done
}
built && { echo "$bin"; exit 0; }

mkdir -p "$bin"
# one build per cache at a time: `make test` builds the node's part while the cluster tests run, and the
# real-node tests ask for it too; the second caller waits here, then finds it built (or, if the first
# failed, tries once more itself)
exec 9>"$bin/.lock"
flock 9
built && { echo "$bin"; exit 0; }

export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
log() { printf '[build-control-plane %s] %s\n' "$(date +%T)" "$*" >&2; }
# A failing command names itself: no step may end the build without saying which command failed.
failed() { log "failed (exit $1): line $2: $3"; }
set -E
trap 'failed $? $LINENO "$BASH_COMMAND"' ERR

workspace() { # NAME -> a new, empty folder for one build's wrapper module (never shared between builds)
  mktemp -d "$scratch/$1.XXXX"
}

wrapper_module() { # MODULE-PATH: `go mod init` in the current folder, its output shown only if it fails
  local out
  out=$(go mod init "$1" 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
}

module_field() { # MODULE@VERSION FIELD -> a field of `go mod download -json`
  (cd "$scratch" && GOFLAGS= go mod download -json "$1") |
    python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"
}

staging_version() { # MODULE WANTED -> WANTED if the proxy serves it, else its newest same-minor tag
  # (the proxy may withhold single versions; only modules outside the build, such as
  # sample-apiserver, have needed this, and any same-minor tag satisfies the module graph)
  local listed
  listed=$(cd "$scratch" && GOFLAGS= go list -m -versions "$1" | tr ' ' '\n' | tail -n +2)
  if grep -qx "$2" <<<"$listed"; then echo "$2"; return; fi
  local fallback
  fallback=$(grep -E "^${2%.*}\.[0-9]+$" <<<"$listed" | sort -V | tail -1)
  [[ -n "$fallback" ]] || { log "no $1 ${2%.*}.x on the module proxy"; return 1; }
  log "$1 $2 is not served by the module proxy; using $fallback"
  echo "$fallback"
}

build_kubernetes() { # PACKAGE... under k8s.io/kubernetes/cmd
  local minor=${K8S_VERSION#v1.}          # 34.7
  local upstream_gomod
  upstream_gomod=$(module_field "k8s.io/kubernetes@$K8S_VERSION" GoMod)
  cd "$(workspace k8s)"
  wrapper_module servinglab.local/k8s-bins
  # Same Go language version and GODEBUG defaults as upstream (godebug only counts in the main module).
  go mod edit -go="$(awk '$1 == "go" {print $2; exit}' "$upstream_gomod")" -require="k8s.io/kubernetes@$K8S_VERSION"
  awk '$1 == "godebug" && NF == 2 {print $2}' "$upstream_gomod" | while read -r setting; do
    go mod edit -godebug="$setting"
  done
  # Upstream requires its staging modules at the placeholder v0.0.0 and replaces them with local
  # paths, which a dependent module cannot see: point each at its published v0.<minor>.<patch> tag.
  local staging
  # (exactly v0.0.0: pseudo-versions such as k8s.io/utils v0.0.0-2025... are real dependencies)
  staging=$(grep -E '^[[:space:]]*(require[[:space:]]+)?k8s\.io/[A-Za-z0-9._-]+ v0\.0\.0([[:space:]]|$)' "$upstream_gomod" |
    sed -E 's/^[[:space:]]*(require[[:space:]]+)?//' | awk '{print $1}' | sort -u)
  for module in $staging; do go mod edit -replace="$module=$module@$(staging_version "$module" "v0.$minor")"; done
  local flags=(-s -w) stamp
  stamp=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=(-X "$pkg.gitVersion=$K8S_VERSION" -X "$pkg.gitMajor=1" -X "$pkg.gitMinor=${minor%%.*}"
            -X "$pkg.gitTreeState=clean" -X "$pkg.buildDate=$stamp")
  done
  log "building Kubernetes $K8S_VERSION ($*)"
  go build -trimpath -tags selinux,notest -ldflags "${flags[*]}" -o "$bin/" "${@/#/k8s.io/kubernetes/cmd/}"
}

build_etcd() {
  # etcd's server module has a main package at its root but replace directives in its go.mod,
  # so `go install ...@version` is refused: build it from a wrapper module instead.
  cd "$(workspace etcd)"
  wrapper_module servinglab.local/etcd-bin
  go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  log "building etcd $ETCD_VERSION"
  go build -trimpath -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
    -o "$bin/etcd" go.etcd.io/etcd/server/v3
}

build_kwok() {
  log "building kwok $KWOK_VERSION"
  GOFLAGS= GOBIN="$bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  local source
  source=$(module_field "sigs.k8s.io/kwok@$KWOK_VERSION" Dir)
  mkdir -p "$bin/kwok-stages"
  cp "$source/kustomize/stage/node/fast/node-initialize.yaml" \
     "$source/kustomize/stage/pod/fast/pod-ready.yaml" \
     "$source/kustomize/stage/pod/fast/pod-delete.yaml" "$bin/kwok-stages/"
  chmod -R u+w "$bin/kwok-stages"
}

build_helm() {
  # helm v3 reports Kubernetes v1.20 to `helm template`/`lint` unless told the real minor.
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local flags=(-s -w -X "helm.sh/helm/v3/internal/version.version=$HELM_VERSION")
  for pkg in pkg/chartutil pkg/lint/rules; do
    flags+=(-X "helm.sh/helm/v3/$pkg.k8sVersionMajor=1" -X "helm.sh/helm/v3/$pkg.k8sVersionMinor=$minor")
  done
  log "building helm $HELM_VERSION"
  GOFLAGS= GOBIN="$bin" go install -trimpath -ldflags "${flags[*]}" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

build_coredns() {
  # a wrapper module, as for etcd: CoreDNS's own go.mod has replace directives
  cd "$(workspace coredns)"
  wrapper_module servinglab.local/coredns-bin
  go mod edit -require="github.com/coredns/coredns@$COREDNS_VERSION"
  log "building coredns $COREDNS_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$bin/coredns-$COREDNS_VERSION.partial" github.com/coredns/coredns
  mv "$bin/coredns-$COREDNS_VERSION.partial" "$bin/coredns-$COREDNS_VERSION"
  ln -sf "coredns-$COREDNS_VERSION" "$bin/coredns"
}

fetch_monitoring_crds() {
  # The Prometheus operator's CRDs ship in its Go module; only the two the chart can create are kept.
  local source target="$bin/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
  log "fetching prometheus-operator $PROMETHEUS_OPERATOR_VERSION CRDs"
  source=$(GOFLAGS= go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  mkdir -p "$target.partial"
  cp "$source/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
     "$source/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" "$target.partial/"
  chmod -R u+w "$target.partial"
  mv "$target.partial" "$target"
}

step() { # NAME COMMAND...: run one build step in a subshell; a failure without a compiler error
  # (a download cut off, a module proxy hiccup) is retried once, a compiler error is not
  local name=$1 output="$scratch/$1.log" status; shift
  for attempt in 1 2; do
    # not in an `if`: there bash would switch errexit off inside the step's functions
    set +e
    trap - ERR  # the step names its own failing command; the pipeline's status is read below
    (set -e; trap 'failed $? $LINENO "$BASH_COMMAND"' ERR; "$@") 2>&1 | tee "$output" >&2
    status=${PIPESTATUS[0]}
    trap 'failed $? $LINENO "$BASH_COMMAND"' ERR
    set -e
    ((status == 0)) && return 0
    if grep -qE '\.go:[0-9]+(:[0-9]+)?: ' "$output" || ((attempt == 2)); then
      log "step $name failed (attempt $attempt); its output is above"
      return 1
    fi
    log "step $name failed without a compiler error; retrying once"
  done
}

build_cluster_part() {
  [[ -x "$bin/kube-apiserver" && -x "$bin/kubectl" && -x "$bin/kube-scheduler" && -x "$bin/kube-controller-manager" ]] ||
    step kubernetes build_kubernetes kube-apiserver kube-controller-manager kube-scheduler kubectl
  [[ -x "$bin/etcd" ]] || step etcd build_etcd
  [[ -x "$bin/kwok" && -d "$bin/kwok-stages" ]] || step kwok build_kwok
  [[ -x "$bin/helm" ]] || step helm build_helm
  [[ -d "$bin/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION" ]] || step monitoring-crds fetch_monitoring_crds
  "$bin/kube-apiserver" --version >&2
  # (sed, not head: head would stop reading after one line, and etcd writing its next one would die of
  # SIGPIPE, which pipefail turns into a failed build: a cold run ended so after building everything)
  "$bin/etcd" --version | sed -n 1p >&2
}

build_node_part() {
  [[ -x "$bin/kubelet" && -x "$bin/kube-proxy" ]] || step node build_kubernetes kubelet kube-proxy
  [[ -x "$bin/coredns-$COREDNS_VERSION" ]] || step coredns build_coredns
  "$bin/kubelet" --version >&2
}

started=$(date +%s)
for part in "${parts[@]}"; do
  part_complete "$part" && continue
  "build_${part}_part"
  touch "$bin/.complete-$part"
  log "$part part done"
done
log "done in $(( $(date +%s) - started )) s"
echo "$bin"
