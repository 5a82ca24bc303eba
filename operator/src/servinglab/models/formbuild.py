"""The model's forms built, cached and gated against eager fp32, in a child process (it imports torch).

    python -m servinglab.models.formbuild '{"folder": ".../prepared/tiny", "modelFile": "model.py",
        "serializedFile": "weights.pt", "form": "onnxruntime", "precision": "fp32", "batchSizes": [1, 2, 4],
        "compile": "none", "cacheDir": "~/.cache/servinglab/forms", "device": "cpu"}'

Started by :mod:`servinglab.models.forms` before a server starts; the raw probe of the forms
(:mod:`servinglab.measure.raw.forms`) shares its tolerance, probe, versions and exports. A form is built from
the model as the server has it (a built-in's `model.py` and weights, or the user's TorchScript/.pt2 file) at
fp32: TorchScript traced, ONNX exported with a dynamic batch axis; the handler converts it to the precision
when it loads it, exactly as the gate here does. `compile` has no file: its record says the mode was built
and checked with these libraries (the server's workers compile it again in their warm-up).

The cache (`cacheDir/<key>/`) is keyed by the model's digest, the form, the precision, the batch sizes,
the compile mode, the device type and the library versions; a second use builds nothing. The gate runs on
every use of a file (a cached file may have been changed since): the form's output on a fixed probe batch
against eager fp32 on the same device, the largest error relative to the reference's largest absolute value
held to the precision's tolerance. On a shared cache (a server pod's model init container, given the cache's
key: :data:`servinglab.models.digests.KEY_ENV`) an entry is reused only with its keyed manifest
(`<key>.manifest.json`, written last) matching it, so nobody else who can write the cache plants a form.
One JSON line on stdout: the form run, or its failure.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

#: Largest error allowed, relative to the largest absolute value of the eager fp32 output, per precision
#: (tf32 and the half types round every product; a form must agree with eager at least that well).
TOLERANCE = {"fp32": 1e-3, "tf32": 2e-2, "fp16": 3e-2, "bf16": 1e-1}
#: Rows of the fixed probe batch the gate compares.
PROBE_ROWS = 4
#: The file each form with a file is kept in (in the cache, and beside the model the server serves).
FORM_FILES = {"torchscript": "servinglab-form.pt", "onnxruntime": "servinglab-form.onnx"}
#: The cache entry's record of the build (what the handler's log cannot say: build time, the gate).
RECORD_FILE = "form.json"
#: Bumped whenever the way forms are built changes, so old entries are rebuilt.
RECIPE_VERSION = "1"


def versions() -> dict[str, str]:
    """The versions a form's build depends on (part of its cache key)."""
    found = {"python": sys.version.split()[0]}
    for name in ("torch", "onnx", "onnxruntime", "torch_tensorrt"):
        if importlib.util.find_spec(name) is not None:
            module = __import__(name)
            found[name] = str(getattr(module, "__version__", "?"))
    return found


def digest_files(files: list[Path]) -> str:
    """sha256 over the model's files, names and contents: the model's part of the cache key."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def cache_key(digest: str, form: str, precision: str, batch_sizes: list[int], compile_mode: str, device: str,
              found: dict[str, str]) -> str:  # fmt: skip
    text = json.dumps([RECIPE_VERSION, digest, form, precision, sorted(batch_sizes), compile_mode, device, found],
                      sort_keys=True)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def gate(reference: Any, output: Any, precision: str) -> dict[str, Any]:
    """The form's `output` against eager fp32's `reference` (same probe batch), camelCase like the results."""
    output = output[0] if isinstance(output, tuple | list) else output
    scale = float(reference.abs().max()) or 1.0
    largest = float((output.float().to(reference.device) - reference).abs().max())
    tolerance = TOLERANCE[precision]
    return {"maxAbsError": largest, "maxRelError": largest / scale, "tolerance": tolerance,
            "passed": bool(largest / scale <= tolerance)}  # fmt: skip


def export_torchscript(network: Any, sample: Any, path: Path, freeze: bool = False) -> None:
    """Traced at `sample`'s shape (a CNN's trace holds at any batch size; the gate checks each one built);
    frozen with `freeze` (the raw probe's fixed precision), left unfrozen for the handler to convert."""
    import torch

    with torch.no_grad():
        traced = torch.jit.trace(network, sample).eval()  # type: ignore[no-untyped-call]
        torch.jit.save(torch.jit.freeze(traced) if freeze else traced, str(path))


def export_onnx(network: Any, sample: Any, path: Path) -> None:
    """ONNX (TorchScript exporter) with a dynamic batch axis, the input named `input`. Not torch's default
    (dynamo) exporter: it needs onnxscript, and it writes the weights to an external data file by default,
    which servinglab refuses in a user's model."""
    import torch

    with torch.no_grad():
        torch.onnx.export(network, (sample,), str(path), input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}}, dynamo=False)  # fmt: skip


class Builder:
    """The model as the server has it, on its device, with the eager fp32 reference on the probe batch."""

    def __init__(self, request: dict[str, Any]) -> None:
        import torch

        from servinglab.models import counting
        from servinglab.models.catalogue import load_module

        self.torch = torch
        self.request = request
        self.imaging = counting.handler_imaging()
        self.datapath = counting.handler_datapath()
        self.device = torch.device(str(request.get("device", "cpu")))
        self.form, self.precision = str(request["form"]), str(request["precision"])
        self.batch_sizes = sorted(int(size) for size in request["batchSizes"]) or [1]
        self.compile_mode = str(request.get("compile", "none"))
        folder = Path(request["folder"])
        serialized = folder / str(request["serializedFile"])
        model_file = request.get("modelFile")
        if model_file:  # a built-in: its definition and seeded weights
            module = load_module(folder / str(model_file), "servinglab_form_model")
            size = int(getattr(module, "INPUT_SIZE", 224))
            network = module.build_model()
            network.load_state_dict(torch.load(serialized, map_location="cpu", weights_only=True))
            self.files = [folder / str(model_file), serialized]
            self.shape = [3, size, size]
        else:
            network = self.imaging.load_serialized(serialized, torch.device("cpu"))
            self.files = [serialized]
            self.shape = [int(n) for n in request["inputShape"]]
        self.network = network.to(self.device).float().eval()
        self.plan = self.imaging.plan_precision(self.precision, self.device)
        generator = torch.Generator().manual_seed(0)
        self.probe = torch.randn(PROBE_ROWS, *self.shape, generator=generator).to(self.device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # the reference is fp32
        with torch.inference_mode():
            self.reference = self.network(self.probe).float()
        self.versions = versions()
        self.key = cache_key(digest_files(self.files), self.form, self.precision, self.batch_sizes, self.compile_mode,
                             self.device.type, self.versions)  # fmt: skip

    def served(self, path: Path | None) -> Any:
        """The form as the handler runs it: the file loaded (or the network compiled), at the precision."""
        torch = self.torch
        if path is None:  # compile: the network itself, converted, then compiled
            import copy

            model = self.imaging.apply_precision(copy.deepcopy(self.network), self.plan, False)
            mode = None if self.compile_mode in ("default", "none") else self.compile_mode
            return torch.compile(model, mode=mode, dynamic=False)
        model = self.imaging.load_serialized(path, self.device, self.plan.allow_tf32)
        return self.imaging.apply_precision(model, self.plan, False)

    def check(self, model: Any, every_size: bool) -> dict[str, Any]:
        """The gate on the probe batch; on a build, the model also runs at each batch size it was built for."""
        torch = self.torch
        with torch.no_grad():
            result = gate(self.reference, model(self.probe.to(self.plan.dtype)), self.precision)
            for size in self.batch_sizes if every_size else []:
                output = model(torch.zeros(size, *self.shape, device=self.device, dtype=self.plan.dtype))
                output = output[0] if isinstance(output, tuple | list) else output
                if output.shape[0] != size:
                    raise RuntimeError(f"the {self.form} form answers {output.shape[0]} rows for a batch of {size}")
        return result

    def build(self, entry: Path) -> None:
        sample = self.probe[:1].contiguous()
        scratch = entry.with_name(f".{entry.name}-{int(time.time() * 1e6)}")
        scratch.mkdir(parents=True)
        try:
            if self.form == "torchscript":
                export_torchscript(self.network, sample, scratch / FORM_FILES["torchscript"])
            elif self.form == "onnxruntime":
                export_onnx(self.network, sample, scratch / FORM_FILES["onnxruntime"])
            shutil.rmtree(entry, ignore_errors=True)
            scratch.rename(entry)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def reusable(self, entry: Path) -> dict[str, str] | None:
        """The digests the cache's entry is reused with, or None when it is not: whole (its record is written
        last) and, with a key, signed as is (its manifest's files); without a key, {} (nothing to hold it to)."""
        from servinglab.models import digests

        if not (entry / RECORD_FILE).is_file():
            return None
        if (key := digests.env_key()) is None:
            return {}
        listed = digests.read_manifest(_manifest(entry), key, {"cacheKey": self.key})
        return listed if listed is not None and digests.difference(entry, listed) is None else None

    def private_copy(self, entry: Path, file: str, listed: dict[str, str] | None) -> Path:
        """The entry's file copied beside the model (the folder the server is given, not the shared cache) and,
        when the entry was reused by its signed manifest, held to the manifest's digest: the copy is what is
        gated and served, so a file swapped in the cache after its check is never read again."""
        from servinglab.models import digests

        copy = Path(self.request.get("verifiedFile") or Path(self.request["folder"]) / f".verified-{file}")
        copy.unlink(missing_ok=True)
        shutil.copyfile(entry / file, copy)
        if listed and (found := digests.file_sha256(copy)) != listed.get(file):
            copy.unlink()
            raise RuntimeError(f"the cached {file} changed after its manifest was checked (sha256 {found}, the "
                               f"manifest says {listed.get(file)})")  # fmt: skip
        return copy

    def run(self) -> dict[str, Any]:
        from servinglab.models import digests

        entry = Path(self.request["cacheDir"]) / self.key
        record = entry / RECORD_FILE
        listed = self.reusable(entry)
        cached = listed is not None
        begun = time.monotonic()
        if not cached:
            self.build(entry)
        file = FORM_FILES.get(self.form)
        path = self.private_copy(entry, file, listed) if file else None
        if cached and path is None:  # compile: nothing kept but the record of its build and gate
            return {**json.loads(record.read_text()), "buildSeconds": 0.0, "cached": True}
        model = self.served(path)
        checked = self.check(model, every_size=not cached and path is not None)  # compile: one graph a size
        backend, provider = {"torchscript": ("torchscript", None), "compile": ("inductor", None)}.get(
            self.form, ("onnxruntime", getattr(model, "provider", None)))  # fmt: skip
        found = {
            "form": self.form, "backend": backend, "provider": provider, "precision": self.precision,
            "batchSizes": self.batch_sizes, "buildSeconds": round(time.monotonic() - begun, 3), "cached": cached,
            "cacheKey": self.key, "gate": checked, "file": str(path) if path else None,
        }  # fmt: skip
        if not cached and checked["passed"]:  # last: an entry with its record is whole
            record.write_text(json.dumps(found))
            if (key := digests.env_key()) is not None:
                digests.write_manifest(entry, _manifest(entry), key, cacheKey=self.key)
        if cached:
            found["buildSeconds"] = 0.0
        return found


def _manifest(entry: Path) -> Path:
    return entry.with_name(f"{entry.name}.manifest.json")


def main(request: dict[str, Any]) -> None:
    try:
        found = Builder(request).run()
    except Exception as error:  # an export that fails is the trial's named failure, not a crash
        found = {"failed": f"{type(error).__name__}: {error}"[:1000]}
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
