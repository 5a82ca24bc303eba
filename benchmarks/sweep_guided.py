"""The search guided by each trial's verdict against today's (unguided) search: trials to the grid's best.

    .venv/bin/python benchmarks/sweep_guided.py [--seconds 2] [--synthetic-only]

1. **Synthetic servers** (tests/sweepsurfaces.py: a batching server whose trials are judged by the real
   verdict; 336 configurations: batch 1..64 x delay 1..50 ms x 1..8 workers): for each, the grid's best,
   and for the guided and the unguided search the trials run, the best found, and after how many trials
   they first reached within 2 % of the grid's best.
2. **The tiny model on this machine** (`servinglab sweep`, closed loop, 16 users, one level of
   `--seconds`): batch 1/4/16 x delay 1/10 ms x 1/2 workers x fp32/bf16 (24 configurations). The grid names
   its winner after re-measuring its best three in alternation (3 rounds); a tie counts all of the tied as
   "the grid's best". Then the guided and the unguided search (`guided: false`), each without confirmation:
   trials run, and the trial at which each first tried one of the grid's best.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from common import SERVINGLAB, table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from servinglab.api import SweepSpec
from servinglab.sweep.search import Outcome, best, propose
from sweepsurfaces import SERVERS


def synthetic() -> None:
    def spec(strategy: str, guided: bool = True) -> SweepSpec:
        return SweepSpec.model_validate({
            "template": {"model": {"name": "tiny"}, "slo": {"p99LatencyMs": 200}}, "strategy": strategy,
            "guided": guided, "space": {"batchSize": {"min": 1, "max": 64},
                                        "maxBatchDelayMs": {"values": [1, 2, 5, 10, 20, 50]},
                                        "workers": {"min": 1, "max": 8, "scale": "linear"}},
        })  # fmt: skip

    rows = []
    for server in SERVERS:
        runs = {}
        for name, sweep in (("grid", spec("grid")), ("guided", spec("search")), ("unguided", spec("search", False))):
            history: list[Outcome] = []
            while (proposal := propose(sweep, history, [], 1)).configs:
                history.append(server.outcome(proposal.configs[0]))
            runs[name] = history
        top = best(runs["grid"])
        assert top is not None and top.score is not None
        cells = [server.name, f"{top.score:.0f} ({top.config.label()[:-5]})"]
        for name in ("guided", "unguided"):
            found = best(runs[name])
            reached = next((i + 1 for i, o in enumerate(runs[name]) if (o.score or 0) >= 0.98 * top.score), None)
            cells += [
                str(len(runs[name])),
                f"{(found.score or 0) / top.score:.0%}" if found else "-",
                str(reached or "never"),
            ]
        rows.append(cells)
    header = [
        "synthetic server",
        "grid's best rps (336 trials)",
        "guided trials",
        "guided best/grid",
        "guided reached it at",
        "unguided trials",
        "unguided best/grid",
        "unguided reached it at",
    ]
    print(table(header, rows))


def sweep_document(name: str, seconds: float, strategy: str, **extra: Any) -> dict[str, Any]:
    space = {"batchSize": {"values": [1, 4, 16]}, "maxBatchDelayMs": {"values": [1, 10]},
             "workers": {"values": [1, 2]}, "precision": {"values": ["fp32", "bf16"]}}  # fmt: skip
    return {
        "apiVersion": "servinglab.dev/v1alpha1", "kind": "ServingSweep", "metadata": {"name": name},
        "spec": {
            "template": {"model": {"name": "tiny"}, "server": {"gpus": 0},
                         "load": {"concurrency": [16], "warmupSeconds": 1, "durationSeconds": seconds,
                                  "payload": {"format": "jpeg"}},
                         "slo": {"p99LatencyMs": 2000}, "ceiling": {"enabled": False}},
            "strategy": strategy, "space": space, "stop": {"patience": 6}, **extra,
        },
    }  # fmt: skip


def run(document: dict[str, Any], folder: Path) -> tuple[dict[str, Any], float]:
    name = document["metadata"]["name"]
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(document))
    started = time.monotonic()
    import subprocess

    subprocess.run([SERVINGLAB, "sweep", str(folder / f"{name}.yaml"), "--output", str(folder / name)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return json.loads((folder / name / "sweep.json").read_text()), time.monotonic() - started


def key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def tiny(seconds: float) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        grid, grid_wall = run(sweep_document("g-grid", seconds, "grid", confirm={"candidates": 3, "rounds": 3}), folder)
        confirmation = grid["confirmation"]
        best_set = {key(c["config"]) for c in confirmation["candidates"] if c.get("tied")} | {
            key(grid["best"]["config"])
        }
        print(f"grid: {grid['counts']['run']} trials + {3 * 3} confirmation runs in {grid_wall:.0f} s; named "
              f"{grid['best']['trial']} ({confirmation['state']}, {grid['best']['capacityRps']:.1f} rps, "
              f"{grid['best']['lowRps']:.1f}..{grid['best']['highRps']:.1f}); the grid's best: {len(best_set)} "
              "configuration(s)")  # fmt: skip
        rows = []
        for label, guided in (("guided", True), ("unguided (today's)", False)):
            document, wall = run(sweep_document(f"g-{int(guided)}", seconds, "search", guided=guided,
                                                confirm={"rounds": 0}), folder)  # fmt: skip
            ordered = sorted(document["trials"], key=lambda t: t["order"])
            reached = next((i + 1 for i, t in enumerate(ordered) if key(t["config"]) in best_set), None)
            verdicts = sorted({(t.get("verdict") or {}).get("bottleneck", "-") for t in ordered})
            rows.append([label, str(document["counts"]["run"]), str(reached or "never"),
                         document["best"]["trial"].split("-", 2)[-1], f"{wall:.0f}", ", ".join(verdicts)])  # fmt: skip
        print(table(["tiny model search", "trials", "tried one of the grid's best at", "its best", "wall s",
                     "verdicts seen"], rows))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--synthetic-only", action="store_true")
    args = parser.parse_args()
    synthetic()
    if not args.synthetic_only:
        tiny(args.seconds)


if __name__ == "__main__":
    main()
