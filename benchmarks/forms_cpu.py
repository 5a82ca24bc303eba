"""The model's forms on this CPU: each form alone and served on each server, side by side, in one run.

    .venv/bin/python benchmarks/forms_cpu.py [--models resnet50,user] [--kinds torchserve,litserve,triton]
        [--forms eager,torchscript,compile,onnxruntime] [--batch 8] [--users 8] [--seconds 15]
        [--raw-seconds 5] [--json forms_cpu.json] [--keep-cache]

One local `servinglab sweep` per model over server x form (`space.kind`, `space.form`) at one fixed, sensible
configuration (batch `--batch`, 1 worker, delay 10 ms, fp32, a closed loop at `--users`), no confirmation
rounds. Models: ResNet-50 (built in: every CPU form) and a user-style model (examples/make-user-model.py's
TorchScript CNN, served from its file: the forms a TorchScript file can take, `torchscript` as it comes and
`onnxruntime` exported). Each trial's results give the form served (the served throughput and p99), the
model alone in that form at the batch the server formed (the ceiling's raw probe, which runs the served
form's own file), and the form's build (seconds, cache hit): the first server of each form builds it into a
fresh cache (`--keep-cache` keeps servinglab's own), the next ones find it there. Printed: one row per model,
server and form, then the gain of each form over the model's baseline form (eager for ResNet-50, TorchScript
as it comes for the user's model), served on the same server at the same batch, and alone. The JSON file has
every row. Thread settings: ONNX Runtime's session takes as many intra-op threads as torch in the same
process (handlers/servinglab_imaging.py, OnnxModel; measure/raw/child.py loads the same file the same way).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from common import SERVINGLAB, table

ROOT = Path(__file__).resolve().parents[1]
#: The forms a user's TorchScript file can take (servinglab.models.forms: as it comes, or exported to ONNX).
USER_FORMS = ("torchscript", "onnxruntime")
BASELINE = {"resnet50": "eager", "user": "torchscript"}


def sweep_document(model: str, kinds: list[str], forms: list[str], args: argparse.Namespace,
                   source: Path | None) -> dict[str, Any]:  # fmt: skip
    reference: dict[str, Any] = {"name": model}
    if source is not None:
        reference = {"name": "user-classifier", "source": {"path": str(source)}, "input": {"kind": "image", "size": 64}}
    return {
        "apiVersion": "servinglab.dev/v1alpha1", "kind": "ServingSweep", "metadata": {"name": f"forms-{model}"},
        "spec": {
            "template": {
                "model": reference,
                "server": {"gpus": 0, "batchSize": args.batch, "maxBatchDelayMs": 10, "workers": 1,
                           "warmupSeconds": 30},
                "load": {"concurrency": [args.users], "warmupSeconds": 5, "durationSeconds": args.seconds,
                         "payload": {"format": "jpeg"}},
                "slo": {"p99LatencyMs": 60000},  # the level's throughput is the capacity: forms compared, not SLOs
                "ceiling": {"rawSeconds": args.raw_seconds},
            },
            "strategy": "grid", "confirm": {"rounds": 0},
            "space": {"kind": {"values": kinds}, "form": {"values": forms}},
        },
    }  # fmt: skip


def rows_of(model: str, output: Path) -> list[dict[str, Any]]:
    """One row per trial: the form served and alone, and its build."""
    found = []
    for path in sorted((output / "trials").glob("*.json")):
        record = json.loads(path.read_text())
        results = record.get("results") or {}
        level = (results.get("results") or [{}])[0]
        ceiling = results.get("ceiling") or {}
        form = (results.get("runtime") or {}).get("form") or {}
        found.append({
            "model": model, "server": record["config"]["kind"], "form": record["config"]["form"],
            "order": record["order"], "state": record["state"], "reason": record.get("reason"),
            "servedRps": level.get("throughputRps"), "p99Ms": (level.get("latencyMs") or {}).get("p99"),
            "formedBatch": (level.get("server") or {}).get("meanBatchSize"),
            "aloneRps": ceiling.get("rawAtFormedBatchRps"), "aloneBatch": ceiling.get("rawBatchSize"),
            "servedOverAlone": ceiling.get("servedOverRaw"), "backend": form.get("backend"),
            "provider": form.get("provider"), "buildSeconds": form.get("buildSeconds"), "cached": form.get("cached"),
            "gateMaxRelError": (form.get("gate") or {}).get("maxRelError"),
        })  # fmt: skip
    return sorted(found, key=lambda row: row["order"])


def gains(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each form over its model's baseline form on the same server: served, and alone (None: not measured)."""
    found = []
    for row in rows:
        base = next((r for r in rows if (r["model"], r["server"]) == (row["model"], row["server"])
                     and r["form"] == BASELINE[row["model"]]), None)  # fmt: skip
        if base is None or row["form"] == base["form"]:
            continue

        def ratio(key: str, row: dict[str, Any] = row, base: dict[str, Any] = base) -> float | None:
            return round(row[key] / base[key], 3) if row.get(key) and base.get(key) else None

        found.append({"model": row["model"], "server": row["server"], "form": row["form"], "over": base["form"],
                      "servedGain": ratio("servedRps"), "aloneGain": ratio("aloneRps")})  # fmt: skip
    return found


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,user", help="resnet50 and/or user (the example's CNN)")
    parser.add_argument("--kinds", default="torchserve,litserve,triton")
    parser.add_argument("--forms", default="eager,torchscript,compile,onnxruntime", help="ResNet-50's forms")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--users", type=int, default=8, help="closed-loop concurrency")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per trial")
    parser.add_argument("--raw-seconds", type=float, default=5.0, help="the model alone, per trial")
    parser.add_argument("--json", type=Path, default=Path("forms_cpu.json"))
    parser.add_argument("--keep-cache", action="store_true", help="use servinglab's form cache (builds kept)")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    rows: list[dict[str, Any]] = []
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ) if args.keep_cache else {**os.environ, "SERVINGLAB_FORMS_DIR": f"{folder}/forms"}
        for model in args.models.split(","):
            source = None
            forms = args.forms.split(",")
            if model == "user":
                source = Path(folder) / "user-classifier.pt"
                subprocess.run([sys.executable, str(ROOT / "examples" / "make-user-model.py"), str(source)],
                               check=True, stdout=subprocess.DEVNULL)  # fmt: skip
                forms = [form for form in USER_FORMS if form in forms or form == BASELINE["user"]]
            spec, output = Path(folder) / f"{model}.yaml", Path(folder) / f"{model}-out"
            spec.write_text(yaml.safe_dump(sweep_document(model, kinds, forms, args, source)))
            began = time.monotonic()
            subprocess.run([SERVINGLAB, "sweep", str(spec), "--output", str(output)], check=True, env=env,
                           stdout=subprocess.DEVNULL)  # fmt: skip
            walls[model] = round(time.monotonic() - began, 1)
            rows += rows_of(model, output)
    load = os.getloadavg()
    print(f"batch {args.batch}, 1 worker, delay 10 ms, fp32, closed loop at {args.users} users, {args.seconds:g} s "
          f"measured, the model alone {args.raw_seconds:g} s; sweeps' wall {walls} s; load average at the end "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    print(table(
        ["model", "server", "form", "state", "served rps", "p99 ms", "formed batch", "alone rps (served form)",
         "served/alone", "backend", "build s", "cache hit"],
        [[r["model"], r["server"], r["form"], r["state"] + (f" ({r['reason']})" if r["reason"] else ""),
          fmt(r["servedRps"]), fmt(r["p99Ms"]), fmt(r["formedBatch"], 2), fmt(r["aloneRps"]),
          fmt(r["servedOverAlone"], 2), r["backend"] or "-", fmt(r["buildSeconds"]),
          "-" if r["cached"] is None else ("yes" if r["cached"] else "no")] for r in rows],
    ))  # fmt: skip
    gained = gains(rows)
    print()
    print(table(["model", "server", "form", "over", "served gain", "alone gain"],
                [[g["model"], g["server"], g["form"], g["over"], fmt(g["servedGain"], 2), fmt(g["aloneGain"], 2)]
                 for g in gained]))  # fmt: skip
    found = {"settings": {k: str(v) for k, v in vars(args).items()}, "loadAverage": load, "wallSeconds": walls,
             "rows": rows, "gains": gained}  # fmt: skip
    args.json.write_text(json.dumps(found, indent=2) + "\n")
    print(f"\nwritten: {args.json}")


if __name__ == "__main__":
    main()
