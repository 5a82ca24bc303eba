"""The winning configuration, ready to deploy: a ServingExperiment that measures it again and the
server's own files that reproduce it in production (through the seam: each server kind writes its
own), rendered purely and written to one folder.

Written by the local sweep into `<output>/best/` and by `servinglab results --sweep --export`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from servinglab import servers
from servinglab.api import KIND, ServingSweep, TrialConfig, trial_spec


def best_files(sweep: ServingSweep, config: TrialConfig) -> dict[str, str]:
    """File name -> text: experiment.yaml, and the server's files for this configuration."""
    spec = trial_spec(sweep.spec, config)
    experiment = {
        "apiVersion": sweep.api_version,
        "kind": KIND,
        "metadata": {"name": f"{sweep.metadata.name[:47]}-best"},
        "spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }
    header = f"# The best configuration of sweep {sweep.metadata.name}: {config.label()}\n"
    files = {"experiment.yaml": header + yaml.safe_dump(experiment, sort_keys=False)}
    for name, text in servers.get(spec.server.kind).export_files(spec).items():
        files[name] = (header if not name.endswith(".json") else "") + text
    return files


def write_best(sweep: ServingSweep, config: TrialConfig, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in best_files(sweep, config).items():
        (folder / name).write_text(text)
        written.append(folder / name)
    return written
