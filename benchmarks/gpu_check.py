"""The one GPU check: everything a lent GPU should tell us, in one run, written as one JSON and one Markdown table.

    make gpu-check                                   # on a GPU machine (hack/gpu-check.sh sets it up)
    .venv/bin/python benchmarks/gpu_check.py --dry-run --out gpu-check   # the same steps on this CPU, small

Steps, in this order, each recorded with its status (ran / failed / skipped, and why) and its wall time; a
failed step never stops the ones after it, and the report is written after every step:
1. environment: the GPU (nvidia-smi), Python, torch and the libraries the forms need;
2. gpu-tests: `pytest tests/gpu` (the dry run only collects them: they need CUDA);
3. raw: the model alone at four precisions (`servinglab.measure.raw.child`), raw/theoretical from the peak table;
4. served: `servinglab run` on each server at one good configuration, for the built-in model and for a
   user-style TorchScript export of it: served rps, p99, served/raw and served/theoretical, NVML telemetry
   and the level's verdict (a server that refuses a user's model, or is not installed, is skipped, saying so);
5. forms: the model alone in each form the device runs (`servinglab.measure.raw.forms`: built, gated against
   eager fp32, timed), then again to show the build cache; its timeout keeps the forms measured before it;
6. served-form-*: `servinglab run` on the first of `--servers` (or `--forms-server`) with the built-in model in
   each form the device runs (raw uint8 bodies, so the worker's JPEG decode does not hide what the form
   changes): served/raw and served/theoretical per form. Last, because each worker of the compiled form
   compiles a graph per padded batch size before it answers.
Each served run's whole results (its warm-up, its ceiling probe) are kept beside the report as check-*.json,
and pytest's output of step 2 as gpu-tests.log.

Budgets: on a GPU the whole check took 5.5 minutes (H200, 16 cores; `--budget` skips the steps not begun in
time), before the served forms; with them, without the raw step and on LitServe alone, 8.3 (docs/benchmarks.md
15b: the compiled form's served run is the longest step: each worker compiles 7 sizes first); the dry run,
which CI runs through tests/integration/test_gpu_check.py, takes about 2.5 on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from common import SERVINGLAB

from servinglab.measure import ceiling
from servinglab.models.counting import count_flops

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ("torchserve", "litserve", "triton")
#: The steps `--skip` can leave out (environment always runs; served-form-* are served-forms').
STEPS = ("gpu-tests", "raw", "user-model", "served", "forms", "forms-cached", "served-forms")


class Settings:
    """What one mode runs: the GPU's full check, or the CPU's small dry run of the same steps."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.device = "cpu" if dry_run else "cuda:0"
        self.model = "tiny" if dry_run else "resnet50"
        self.precisions = ["fp32", "bf16"] if dry_run else ["fp32", "tf32", "fp16", "bf16"]
        self.raw_sizes = [1, 8] if dry_run else [1, 8, 64, 256]
        self.raw_seconds = 1.0 if dry_run else 5.0
        self.form_precision = "fp32" if dry_run else "fp16"
        self.form_batch = 8 if dry_run else 64
        self.form_seconds = 0.5 if dry_run else 3.0
        self.server = (
            {"batchSize": 4, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32", "gpus": 0}
            if dry_run
            else {"batchSize": 64, "maxBatchDelayMs": 10, "workers": 2, "precision": "fp16", "gpus": 1}
        )
        self.users = 4 if dry_run else 256
        self.warmup, self.seconds, self.raw_budget = (1, 2, 1) if dry_run else (3, 8, 4)
        self.forms_timeout = 300.0 if dry_run else 200.0
        self.results: Path | None = None  # where each served run's whole results go (the report's folder)
        # served per form: the forms a CPU builds in seconds for the dry run; eager, TorchScript and CUDA graphs
        # (torch.compile reduce-overhead: one graph per padded batch size, compiled as each worker starts) on a GPU
        self.served_forms: dict[str, dict[str, Any]] = {
            "eager": {"form": "eager"},
            "torchscript": {"form": "torchscript"},
        }
        if not dry_run:
            self.served_forms["compile-cudagraphs"] = {"form": "compile", "dataPath": {"compile": "reduce-overhead"}}


class Skipped(Exception):
    """A step this machine cannot run; its message says why (recorded, not a failure)."""


def run_child(module: str, request: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
    """The child's events; on a timeout the events it printed so far and one `timedOut` event."""
    try:
        done = subprocess.run([sys.executable, "-m", module, json.dumps(request)], capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        printed = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
        events = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
        return [*events, {"event": "timedOut", "seconds": timeout}]
    if done.returncode != 0:
        raise RuntimeError(f"{module} exited {done.returncode}: {done.stderr.strip()[-800:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def environment(settings: Settings) -> dict[str, Any]:
    import importlib.util

    import torch

    found: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cudaAvailable": torch.cuda.is_available(),
    }
    for name in ("torchvision", "onnx", "onnxruntime", "torch_tensorrt", "tensorrt", "litserve", "pynvml"):
        found[name] = importlib.util.find_spec(name) is not None
    if shutil.which("nvidia-smi"):
        query = "--query-gpu=name,driver_version,memory.total"
        smi = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True, check=False
        )
        found["gpus"] = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
    if not settings.dry_run and not found["cudaAvailable"]:
        raise RuntimeError("no CUDA device: run with --dry-run on a machine without a GPU")
    return found


def gpu_tests(settings: Settings, out: Path) -> dict[str, Any]:
    """`pytest tests/gpu`; its whole output in gpu-tests.log beside the report (a failure's traceback)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "tests/gpu"]
    if settings.dry_run:
        command.append("--collect-only")
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired as late:  # what it said before the timeout, kept
        (out / "gpu-tests.log").write_bytes(bytes(late.stdout or b"") + bytes(late.stderr or b""))
        raise
    (out / "gpu-tests.log").write_text(done.stdout + done.stderr)
    lines = done.stdout.strip().splitlines()
    tail = lines[-1:] or [done.stderr.strip()[-300:]]
    failed = [line.removeprefix("FAILED ")[:300] for line in lines if line.startswith("FAILED ")]
    if done.returncode != 0:
        raise RuntimeError(f"pytest tests/gpu exited {done.returncode}: {tail[0]}; " + " | ".join(failed))
    return {"summary": tail[0], "collectedOnly": settings.dry_run}


def raw(settings: Settings) -> list[dict[str, Any]]:
    flops = count_flops(settings.model)
    rows = []
    for precision in settings.precisions:
        request = {
            "model": settings.model,
            "precision": precision,
            "device": settings.device,
            "batchSizes": settings.raw_sizes,
            "seconds": settings.raw_seconds,
        }
        events = run_child("servinglab.measure.raw.child", request, timeout=180)
        device = next(event["device"] for event in events if event["event"] == "ready")
        peak = ceiling.PEAK_TFLOPS.get(ceiling.accelerator_of(device) or "", {}).get(precision)
        theoretical = ceiling.theoretical_rps(flops, peak)
        for event in events:
            if event["event"] == "measured":
                rps = float(event["throughputRps"])
                rows.append(
                    {
                        "precision": precision,
                        "batchSize": event["batchSize"],
                        "throughputRps": rps,
                        "theoreticalRps": theoretical,
                        "rawOverTheoretical": rps / theoretical if theoretical else None,
                    }
                )
            elif event["event"] == "skipped":
                rows.append({"precision": precision, "batchSize": event["batchSize"], "skipped": event["reason"]})
    return rows


def forms(settings: Settings, cache: Path, names: list[str]) -> list[dict[str, Any]]:
    request = {
        "model": settings.model,
        "precision": settings.form_precision,
        "device": settings.device,
        "forms": names,
        "batchSize": settings.form_batch,
        "seconds": settings.form_seconds,
        "cacheDir": str(cache),
    }
    events = run_child("servinglab.measure.raw.forms", request, timeout=settings.forms_timeout)
    rows = [event for event in events if event["event"] == "form"]
    if events and events[-1]["event"] == "timedOut":  # the form being built when time ran out, named
        left = [name for name in names if name not in {row["form"] for row in rows}]
        rows += [{"form": name, "status": "timed-out", "reason": f"the forms' {settings.forms_timeout:g} s ran out"}
                 for name in left]  # fmt: skip
    return rows


def user_style_model(settings: Settings, folder: Path) -> dict[str, Any]:
    """The built-in model with its served weights, exported as a user would: a traced TorchScript file."""
    import torch

    from servinglab.models.counting import network

    model, size = network(settings.model, weights=True)
    path = folder / f"{settings.model}-user.pt"
    with torch.no_grad():
        torch.jit.save(torch.jit.trace(model, torch.zeros(1, 3, size, size)), str(path))
    return {"path": str(path), "size": size}


def served(
    settings: Settings, folder: Path, kind: str, user_model: dict[str, Any] | None, form: str | None = None
) -> dict[str, Any]:
    """One `servinglab run` at the check's configuration; with `form`, the built-in model in that form (the
    settings' `served_forms`) and raw uint8 bodies."""
    if kind == "triton":
        from servinglab.servers.triton.env import TritonEnvMissing, find_env

        try:
            find_env()
        except TritonEnvMissing as missing:
            raise Skipped(f"no Triton environment on this machine ({missing})") from None
    model: dict[str, Any] = {"name": settings.model}
    if user_model is not None:
        model = {
            "name": f"{settings.model}-user",
            "source": {"path": user_model["path"]},
            "input": {"kind": "image", "size": user_model["size"]},
        }
    server = {"kind": kind, **settings.server, **(settings.served_forms[form] if form else {})}
    if form:
        server["startupTimeoutSeconds"] = 600  # each worker compiles its graphs before it answers
    document = {
        "apiVersion": "servinglab.dev/v1alpha1",
        "kind": "ServingExperiment",
        "metadata": {"name": f"check-{kind}-{f'form-{form}' if form else 'user' if user_model else 'builtin'}"},
        "spec": {
            "model": model,
            "server": server,
            "load": {
                "concurrency": [settings.users],
                "warmupSeconds": settings.warmup,
                "durationSeconds": settings.seconds,
                "payload": {"format": "raw" if form else "jpeg"},
            },
            "ceiling": {"rawSeconds": settings.raw_budget},
        },
    }
    name = document["metadata"]["name"]
    spec_file, out = folder / f"{name}.yaml", (settings.results or folder) / f"{name}.json"
    spec_file.write_text(yaml.safe_dump(document))
    out.unlink(missing_ok=True)  # an earlier check's results are not this run's
    done = subprocess.run(
        [SERVINGLAB, "run", str(spec_file), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=1000 if form else 400,  # a compiled form's workers compile first (startupTimeoutSeconds 600)
        check=False,
    )
    row: dict[str, Any] = {
        "model": model["name"],
        "server": kind,
        "config": server,
        "users": settings.users,
        "form": form or "eager",
        "payload": "raw" if form else "jpeg",
    }
    if done.returncode != 0 or not out.exists():
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        said = " / ".join(lines[-3:])[-600:]
        if "ModelNotSupported" in said or ("invalid experiment" in said and "model.source" in said):
            raise Skipped(f"{kind} refuses a user's model: {said}")  # what the server does not support yet
        raise RuntimeError(f"servinglab run exited {done.returncode}: {said}")
    results = json.loads(out.read_text())
    level, figures = results["results"][0], results.get("ceiling") or {}
    runtime = results.get("runtime") or {}
    verdict = level.get("verdict") or {}
    return {
        **row,
        "status": "ran",
        "throughputRps": level["throughputRps"],
        "p99Ms": level["latencyMs"].get("p99"),  # none when no request finished in the window
        "errors": level["errors"],
        "formedBatch": (level.get("server") or {}).get("meanBatchSize"),
        "rawAtFormedBatchRps": figures.get("rawAtFormedBatchRps"),
        "servedOverRaw": figures.get("servedOverRaw"),
        "servedOverTheoretical": figures.get("servedOverTheoretical"),
        "precisionNote": runtime.get("precisionNote"),
        "formRun": runtime.get("form"),
        "gpu": level.get("gpu"),
        "gpuTelemetry": runtime.get("gpuTelemetry"),
        "verdict": verdict.get("bottleneck"),
        "because": verdict.get("because"),
        "generatorSaturated": bool((level.get("generator") or {}).get("saturated")),
    }


def step(report: dict[str, Any], name: str, action: Callable[[], Any], into: str | None = None) -> Any:
    """Run one step and record it, its value under `into` (appended where that is a list); with the check's
    budget spent, record it as skipped. The report is written after every step, its value in it, so a check
    cut short still leaves what it measured."""
    began = time.monotonic()
    print(f"[gpu-check] {name} ...", file=sys.stderr, flush=True)
    try:
        if began > report["_deadline"]:
            raise Skipped(f"the check's budget of {report['budgetSeconds']:g} s was spent")
        value = action()
        entry = {"name": name, "status": "ran"}
    except Skipped as why:
        value, entry = None, {"name": name, "status": "skipped", "reason": str(why)}
    except Exception as error:  # recorded, and the next step still runs
        value, entry = None, {"name": name, "status": "failed", "reason": f"{type(error).__name__}: {error}"[:800]}
    entry["seconds"] = round(time.monotonic() - began, 1)
    report["steps"].append(entry)
    if isinstance(report.get(into or ""), list):
        report[str(into)].append(value)
    elif into is not None:
        report[into] = value
    print(f"[gpu-check] {name}: {entry['status']} in {entry['seconds']} s", file=sys.stderr, flush=True)
    write(report)
    return value


def write(report: dict[str, Any]) -> None:
    out: Path = report["_out"]
    shown = {key: value for key, value in report.items() if not key.startswith("_")}
    (out / "gpu-check.json").write_text(json.dumps(shown, indent=2) + "\n")
    (out / "gpu-check.md").write_text(markdown(shown))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same steps on the CPU with the tiny model")
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument(
        "--skip",
        default="",
        help=f"steps to leave out, comma-separated: {', '.join(STEPS)}",
    )
    parser.add_argument("--budget", type=float, default=480.0, help="seconds; steps not begun by then are skipped")
    parser.add_argument("--served-forms", default="", help="the forms served, comma-separated (default: every one)")
    parser.add_argument(
        "--forms-server", choices=SERVERS, help="the served forms' server (default: the first of --servers)"
    )
    args = parser.parse_args()
    settings = Settings(args.dry_run)
    settings.results = args.out
    servers = [kind for kind in args.servers.split(",") if kind]
    if unknown := sorted(set(servers) - set(SERVERS)):
        parser.error(f"--servers: no server {', '.join(unknown)} (there are {', '.join(SERVERS)})")
    forms_server = args.forms_server or (servers[0] if servers else SERVERS[0])
    if args.served_forms:
        chosen = [name for name in args.served_forms.split(",") if name]
        if unknown := sorted(set(chosen) - set(settings.served_forms)):
            parser.error(
                f"--served-forms: no served form {', '.join(unknown)} (there are {', '.join(settings.served_forms)})"
            )
        settings.served_forms = {name: settings.served_forms[name] for name in chosen}
    skip = set(filter(None, args.skip.split(",")))
    if unknown := sorted(skip - set(STEPS)):
        parser.error(f"--skip: no step {', '.join(unknown)} (there are {', '.join(STEPS)})")
    report: dict[str, Any] = {
        "mode": "dry-run" if args.dry_run else "gpu",
        "model": settings.model,
        "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "budgetSeconds": args.budget,
        "steps": [],
        "_out": args.out,
        "_deadline": time.monotonic() + args.budget,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    step(report, "environment", lambda: environment(settings), into="environment")
    for name, action in (("gpu-tests", lambda: gpu_tests(settings, args.out)), ("raw", lambda: raw(settings))):
        if name not in skip:
            step(report, name, action, into=name.replace("-", "_"))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        folder = Path(scratch)
        user_model = None
        if not {"user-model", "served"} & skip:  # the user-style export, served beside the built-in model
            user_model = step(report, "user-model", lambda: user_style_model(settings, folder))
        report["served"] = []
        models = (None, user_model) if user_model is not None else (None,)
        for kind in [] if "served" in skip else servers:
            for model in models:
                label = f"served-{kind}-{'user' if model else 'builtin'}"
                step(report, label, lambda k=kind, m=model: served(settings, folder, k, m), into="served")
        # then the forms: a compile can take minutes, and its own timeout keeps the rows built before it ends
        remaining = max(30.0, report["_deadline"] - time.monotonic() + 30)
        settings.forms_timeout = min(settings.forms_timeout, remaining)
        all_forms = ["eager", "torchscript", "onnxruntime", "tensorrt", "compile", "compile-cudagraphs"]
        for name, names in (("forms", all_forms), ("forms-cached", ["torchscript", "onnxruntime"])):
            if name not in skip:
                step(report, name, lambda n=names: forms(settings, folder / "forms", n), into=name.replace("-", "_"))
        # served per form last: each worker of the compiled form compiles a graph per padded batch size first
        report["served_forms"] = []
        for form in [] if "served-forms" in skip else settings.served_forms:
            step(report, f"served-form-{form}", lambda f=form: served(settings, folder, forms_server, None, f),
                 into="served_forms")  # fmt: skip
    print((args.out / "gpu-check.md").read_text())
    return 1 if any(entry["status"] == "failed" for entry in report["steps"]) else 0


def cell(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}".replace(",", " ")
    return str(value)


def markdown(report: dict[str, Any]) -> str:
    env = report.get("environment") or {}
    lines = [
        f"# GPU check ({report['mode']}, {report['startedAt']})",
        "",
        f"Device: {', '.join(env.get('gpus') or ['no GPU'])}; Python {env.get('python')}, torch {env.get('torch')}.",
        "",
        "| step | status | seconds | reason |",
        "|---|---|---|---|",
    ]
    lines += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s.get('reason', '')} |" for s in report["steps"]]
    if report.get("raw"):
        lines += [
            "",
            "## The model alone, per precision",
            "",
            "| precision | batch | raw rps | theoretical rps | raw/theoretical |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['precision']} | {r['batchSize']} | {cell(r.get('throughputRps'))} | "
            f"{cell(r.get('theoreticalRps'))} | {cell(r.get('rawOverTheoretical'), 3)} |"
            for r in report["raw"]
        ]
    for key, title in (("forms", "The model alone, per form"), ("forms_cached", "Again: the build cache")):
        if report.get(key):
            lines += [
                "",
                f"## {title}",
                "",
                "| form | status | backend | build s | cached | max rel error | rps | reason |",
                "|---|---|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {f['form']} | {f['status']} | {f.get('backend', '-')}"
                f"{'/' + f['provider'] if f.get('provider') else ''} | {cell(f.get('buildSeconds'), 1)} | "
                f"{cell(f.get('cached'))} | "
                f"{cell((f.get('gate') or {}).get('maxRelError'), 6)} | {cell(f.get('throughputRps'))} | "
                f"{f.get('reason', '')} |"
                for f in report[key]
            ]
    for key, title in (("served", "Served, one good configuration per server"),
                       ("served_forms", "Served in each form (raw uint8 bodies)")):  # fmt: skip
        lines += served_table(title, [r for r in report.get(key) or [] if r])
    return "\n".join(lines) + "\n"


def served_table(title: str, rows: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    if rows:
        lines += [
            "",
            f"## {title}",
            "",
            "| model | form | payload | server | status | rps | p99 ms | formed batch | raw at that batch | "
            "served/raw | served/theoretical | GPU util % | verdict | reason |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            gpu = r.get("gpu") or {}
            lines.append(
                f"| {r['model']} | {r.get('form', 'eager')} | {r.get('payload', 'jpeg')} | {r['server']} | "
                f"{r['status']} | {cell(r.get('throughputRps'))} | "
                f"{cell(r.get('p99Ms'), 1)} | {cell(r.get('formedBatch'), 1)} | "
                f"{cell(r.get('rawAtFormedBatchRps'))} | {cell(r.get('servedOverRaw'), 2)} | "
                f"{cell(r.get('servedOverTheoretical'), 4)} | {cell(gpu.get('utilizationAvgPercent'), 0)} | "
                f"{r.get('verdict') or '-'} | {r.get('reason', '')} |"
            )
    return lines


if __name__ == "__main__":
    sys.exit(main())
