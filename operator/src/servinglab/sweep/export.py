"""The winning configuration, ready to deploy: a ServingExperiment that measures it again and the
TorchServe files that reproduce it in production (pure rendering plus one folder write).

Written by the local sweep into `<output>/best/` and printed by `servinglab results --sweep`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from servinglab import tsconfig
from servinglab.k8s.resources import pod_config_properties
from servinglab.sweepspec import ServingSweep, TrialConfig, trial_spec


def best_files(sweep: ServingSweep, config: TrialConfig) -> dict[str, str]:
    """File name -> text: experiment.yaml, config.properties, model-config.yaml, metrics.yaml."""
    spec = trial_spec(sweep.spec, config)
    experiment: dict[str, Any] = {
        "apiVersion": sweep.api_version,
        "kind": "ServingExperiment",
        "metadata": {"name": f"{sweep.metadata.name[:47]}-best"},
        "spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }
    header = f"# The best configuration of sweep {sweep.metadata.name}: {config.label()}\n"
    return {
        "experiment.yaml": header + yaml.safe_dump(experiment, sort_keys=False),
        "config.properties": header + pod_config_properties(spec.model.name, spec),
        "model-config.yaml": header + tsconfig.render_model_config(spec.server, spec.load),
        "metrics.yaml": tsconfig.render_metrics_config(),
    }


def write_best(sweep: ServingSweep, config: TrialConfig, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in best_files(sweep, config).items():
        (folder / name).write_text(text)
        written.append(folder / name)
    return written
