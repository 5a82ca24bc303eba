"""The parts of a server pod that every server kind shares (pure): the init container that puts the model
in place, the one that counts a user's model, their volumes and sizes, and the `restricted` security
context. Each kind's pod module (e.g. :mod:`servinglab.servers.torchserve.pod`) adds its server container.

An init container from the servinglab image (`model`) builds the built-in model (seeded weights, no
downloads) or fetches, checks and lays out the user's (`servinglab prepare-model`: a URL, with credentials
from a Secret mounted into it alone, or a claim mounted read-only into it alone) into an emptyDir, laid out
as the server kind serves it. A URL's query string (a pre-signed URL's signature) reaches it from the
operator's per-experiment Secret, never from the ConfigMap, whose spec has it redacted. It runs only
servinglab's code, so it alone mounts the model cache claim (read-write: it keeps downloads and builds
there), and it alone gets the key that signs the builds' manifests there (the operator's key Secret). A
user's model is then counted (`servinglab count-model`, which loads it: a .pt2 unpickles) by a second init
container (`probe`) with the model store read-only and no cache, claim or credentials. `server.form` is built
and gated by `servinglab prepare-form` (the local path's code): a built-in's in `model`, cached on the claim; a
user's model's in a third init container (`form`), as bare as `probe` but for the writable model store. Every
emptyDir has a sizeLimit (the model store's from the source's maxBytes), so a model cannot fill the node's disk.
"""

from __future__ import annotations

from servinglab.api import ExperimentSpec
from servinglab.api.forms import ModelForm
from servinglab.models.digests import KEY_ENV as CACHE_KEY_ENV
from servinglab.models.fetch import AUTHORIZATION_ENV, MODEL_URL_ENV, MODEL_URL_KEY
from servinglab.servers.base import FORM_INIT, MODEL_INIT, PROBE_INIT, Manifest, PodInputs, restricted, size_limit

#: Where a pvc model source's claim is mounted, in the init container only.
MODEL_SOURCE_DIR = "/model-source"
#: Where the operator's model cache claim is mounted, in the init container only.
MODEL_CACHE_DIR = "/model-cache"
#: The key of the model cache key's Secret that holds the key.
MODEL_CACHE_KEY_FIELD = "key"

_GI = 2**30
#: What a built-in model may take (resnet50's archive is about 100 MB), in place of a source's maxBytes.
BUILTIN_MODEL_BYTES = _GI
#: Room beside the model in the model store: servinglab's handler, the rendered config, the description.
_STORE_MARGIN_BYTES = _GI // 4
#: The probe's scratch: torch and the model's loader may want a /tmp.
PROBE_TMP_BYTES = _GI
#: The forms built as a file (the others run the model as it is).
FILE_FORMS = (ModelForm.TORCHSCRIPT, ModelForm.ONNXRUNTIME, ModelForm.TENSORRT)


def model_bytes(spec: ExperimentSpec) -> int:
    """The most the model may take on disk: the source's maxBytes, or what a built-in model takes."""
    source = spec.model.source
    return source.max_bytes if source is not None else BUILTIN_MODEL_BYTES


def form_bytes(spec: ExperimentSpec) -> int:
    """What the model's built form may take on disk: about the model again (an exported TorchScript or ONNX
    file holds the weights); nothing for eager and compile, which write no file."""
    return model_bytes(spec) if spec.server.form in FILE_FORMS else 0


def model_store_bytes(spec: ExperimentSpec) -> int:
    """The model store's sizeLimit: twice the model (an archive and what it unpacks to are both there while
    it is unpacked; a download, before it is moved into place), its built form beside it, and the margin."""
    return 2 * model_bytes(spec) + form_bytes(spec) + _STORE_MARGIN_BYTES


def probe_tmp_bytes(spec: ExperimentSpec) -> int:
    """/tmp of the probe and of a user's model's form build: torch's scratch, and the form built there (its
    file, and room for the exporter's own copy while it writes) before it is merged into the model store."""
    return PROBE_TMP_BYTES + 2 * form_bytes(spec)


def tmp_bytes(spec: ExperimentSpec) -> int:
    """/tmp of the model init container and the server: a built-in build without a cache claim, the
    server's temporary files (which may hold a copy of the model)."""
    return model_bytes(spec) + _GI


def model_init_container(
    spec: ExperimentSpec, inputs: PodInputs, model_store: str, config_dir: str, then: str = "", packed: str = ""
) -> Manifest:
    """The init container that puts the model into `model_store`, laid out for the spec's server kind: a
    built-in one is built from its seeded code; the user's is fetched, checked and laid out by `servinglab
    prepare-model`, whose termination message is the model's description (or the reason it could not be
    served). Credentials for a URL come from the spec's Secret into this container alone. With a cache
    claim, builds and downloads are kept on it (mounted here only: nothing of the user's runs here) and
    reused once re-checked against their digests; the copy in the model store is what was checked. `then`:
    shell lines the server kind runs after (e.g. copying a rendered file beside the model). A built-in's
    `server.form` is built here too (`servinglab prepare-form`, kept in the cache claim's `forms/`; its run
    added to the termination message as `form`): the model's code is servinglab's own. `packed`: where in
    the model's folder the server kind laid the model out (Triton: 1/build), where the form is put."""
    model = spec.model.name
    cached = inputs.model_cache_claim is not None
    mounts: list[Manifest] = [
        {"name": "model-store", "mountPath": model_store},
        {"name": "config", "mountPath": config_dir, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    env: list[Manifest] = []
    if cached:
        mounts.append({"name": "model-cache", "mountPath": MODEL_CACHE_DIR})
    if cached and inputs.model_cache_key_secret is not None:  # signs and checks the builds' manifests there
        key = {"name": inputs.model_cache_key_secret, "key": MODEL_CACHE_KEY_FIELD}
        env.append({"name": CACHE_KEY_ENV, "valueFrom": {"secretKeyRef": key}})
    source = spec.model.source
    if source is None:
        builds = f"{MODEL_CACHE_DIR if cached else '/tmp/model-cache'}/builtin"
        script = (
            f"servinglab build-model {model} --build-dir {builds} --into {model_store}/{model} "
            f"--server {spec.server.kind} --quiet --termination-log /dev/termination-log\n"
        )
        if spec.server.form is not None:
            forms = f"{MODEL_CACHE_DIR if cached else '/tmp/model-cache'}/forms"
            script += (
                f"servinglab prepare-form --spec-file {config_dir}/{inputs.experiment_file} "
                f"--folder {_folder(spec, model_store, packed)} --cache {forms} --merge "
                "--termination-log /dev/termination-log\n"
            )
    else:
        options = f" --cache {MODEL_CACHE_DIR}" if cached else ""
        if source.pvc is not None:
            mounts.append({"name": "model-source", "mountPath": MODEL_SOURCE_DIR, "readOnly": True})
            options += f" --mounted {MODEL_SOURCE_DIR}"
        if source.authorization_secret is not None:
            secret = source.authorization_secret
            env.append({"name": AUTHORIZATION_ENV,
                        "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}})  # fmt: skip
        if inputs.model_url_secret is not None:  # a pre-signed URL: the ConfigMap's spec has its query redacted
            whole_url = {"name": inputs.model_url_secret, "key": MODEL_URL_KEY}
            env.append({"name": MODEL_URL_ENV, "valueFrom": {"secretKeyRef": whole_url}})
        script = (
            f"servinglab prepare-model --spec-file {config_dir}/{inputs.experiment_file} "
            f"--into {model_store}/{model}{options} --no-count --termination-log /dev/termination-log\n"
        )
    container: Manifest = {
        "name": MODEL_INIT,
        "image": inputs.servinglab_image,
        "command": ["sh", "-ec"],
        "args": [script + then],
        "volumeMounts": mounts,
        "securityContext": restricted(),
    }
    if env:
        container["env"] = env
    if (gpus := _form_gpus(spec, inputs)) is not None and source is None:
        container["resources"] = gpus
    return container


def _folder(spec: ExperimentSpec, model_store: str, packed: str) -> str:
    return "/".join(part for part in (model_store, spec.model.name, packed) if part)


def _form_gpus(spec: ExperimentSpec, inputs: PodInputs) -> Manifest | None:
    """The server's GPUs, for the container that builds and gates a form on them (a GPU's form is checked
    where it is served); None without a form or GPUs. Init containers run before the server's container,
    so the pod holds no more GPUs for it."""
    if spec.server.form is None or not spec.server.gpus:
        return None
    return {"limits": {inputs.gpu_resource: str(spec.server.gpus)}}


def form_init_container(spec: ExperimentSpec, inputs: PodInputs, model_store: str, config_dir: str,
                        packed: str = "") -> Manifest:  # fmt: skip
    """The init container that builds a user's model's `server.form` beside it (`servinglab prepare-form`):
    building loads the user's model (a .pt2 unpickles), so, like `probe`, it has no cache claim, no source
    claim and no credentials (nothing is kept: each experiment builds its form anew); it writes the model
    store, where the form goes. Its termination message is the form run, or "<Reason>: <message>"."""
    container: Manifest = {
        "name": FORM_INIT,
        "image": inputs.servinglab_image,
        "command": ["servinglab", "prepare-form"],
        "args": [
            "--spec-file",
            f"{config_dir}/{inputs.experiment_file}",
            "--folder",
            _folder(spec, model_store, packed),
            "--cache",
            "/tmp/forms",
            "--termination-log",
            "/dev/termination-log",
        ],
        "volumeMounts": [
            {"name": "model-store", "mountPath": model_store},
            {"name": "config", "mountPath": config_dir, "readOnly": True},
            {"name": "probe-tmp", "mountPath": "/tmp"},
        ],
        "securityContext": restricted(),
    }
    if (gpus := _form_gpus(spec, inputs)) is not None:
        container["resources"] = gpus
    return container


def probe_init_container(spec: ExperimentSpec, inputs: PodInputs, model_store: str, packed: str = "") -> Manifest:
    """The init container that counts a user's model (`servinglab count-model`; `packed`: where in the model's
    folder the server laid it out): loading it runs the user's code (a .pt2 unpickles), so it sees the model
    store read-only and its own /tmp, nothing else: no cache claim, no source claim, no credentials. Its
    termination message is the counts."""
    folder = _folder(spec, model_store, packed)
    return {
        "name": PROBE_INIT,
        "image": inputs.servinglab_image,
        "command": ["servinglab", "count-model", folder],
        "args": ["--termination-log", "/dev/termination-log"],
        "volumeMounts": [
            {"name": "model-store", "mountPath": model_store, "readOnly": True},
            {"name": "probe-tmp", "mountPath": "/tmp"},
        ],
        "securityContext": restricted(),
    }


def model_init_containers(spec: ExperimentSpec, inputs: PodInputs, model_store: str, config_dir: str,
                          then: str = "", packed: str = "") -> list[Manifest]:  # fmt: skip
    """The model's init containers: `model`, and `probe` for a user's model (laid out at `packed` in its
    folder), then `form` for a user's model's `server.form`."""
    user = spec.model.source is not None
    probe = [probe_init_container(spec, inputs, model_store, packed)] if user else []
    form = [form_init_container(spec, inputs, model_store, config_dir, packed)] if user and spec.server.form else []
    return [model_init_container(spec, inputs, model_store, config_dir, then, packed), *probe, *form]


def model_volumes(spec: ExperimentSpec, cache_claim: str | None) -> list[Manifest]:
    """The model store (sized), the probe's /tmp, the source's claim and the cache claim, as needed."""
    volumes: list[Manifest] = [{"name": "model-store", "emptyDir": {"sizeLimit": size_limit(model_store_bytes(spec))}}]
    source = spec.model.source
    if source is not None:
        volumes.append({"name": "probe-tmp", "emptyDir": {"sizeLimit": size_limit(probe_tmp_bytes(spec))}})
    if source is not None and source.pvc is not None:
        claim = {"claimName": source.pvc.claim_name, "readOnly": True}
        volumes.append({"name": "model-source", "persistentVolumeClaim": claim})
    if cache_claim:
        volumes.append({"name": "model-cache", "persistentVolumeClaim": {"claimName": cache_claim}})
    return volumes
