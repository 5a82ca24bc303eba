"""The winning configuration, ready to deploy: a ServingExperiment that measures it again, the
server's own files that reproduce it in production (through the seam: each server kind writes its
own), and, given the named best's measurements, its capacity plan and the autoscaler documents that apply
it (:mod:`servinglab.sweep.plan`), rendered purely and written to one folder.

Written by the local sweep into `<output>/best/` and by `servinglab results --sweep --export`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from servinglab import servers
from servinglab.api import KIND, ServingSweep, TrialConfig, trial_spec
from servinglab.api.states import Confidence
from servinglab.api.trials import SweepBest
from servinglab.sweep import plan, plancheck


def best_files(sweep: ServingSweep, config: TrialConfig, best: SweepBest | None = None) -> dict[str, str]:
    """File name -> text: experiment.yaml, and the server's files for this configuration; with the named
    `best`, its capacity plan (and the autoscalers' documents when the plan has a replica count)."""
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
    # no plan for a configuration that missed the SLO
    if best is not None and best.confidence != Confidence.NONE_WITHIN_SLO:
        files |= plan_files(sweep, best)
    return files


def plan_files(sweep: ServingSweep, best: SweepBest) -> dict[str, str]:
    """capacity-plan.yaml, and with a replica count and an in-flight target the autoscalers' documents (the
    workload they scale is named like the exported experiment: `<sweep>-best`); with a replica count and an
    SLO, plan-check.yaml: the experiment that runs the plan at its peak (:mod:`servinglab.sweep.plancheck`)."""
    found = plan.of_sweep(best, sweep.spec.capacity, sweep.spec.template.cost, sweep.spec.template.server.replicas)
    name = f"{sweep.metadata.name[:47]}-best"
    header = f"# The capacity plan of sweep {sweep.metadata.name}'s best: {best.config.label()}\n"
    files = {"capacity-plan.yaml": header + yaml.safe_dump(found.model_dump(by_alias=True, exclude_none=True),
                                                             sort_keys=False)}  # fmt: skip
    if found.replicas is not None and sweep.spec.template.slo.p99_latency_ms is not None:
        check = plancheck.check_manifest(f"{sweep.metadata.name[:47]}-check", sweep.api_version,
                                         trial_spec(sweep.spec, best.config), found)  # fmt: skip
        files[plancheck.CHECK_FILE] = (
            f"# Checks the capacity plan of sweep {sweep.metadata.name}: {found.replicas} replicas of "
            f"{best.config.label()} at the peak of {found.peak_rps:g} rps (apply it; then with server.replicas "
            f"{found.replicas - 1} the SLO should break)\n" + yaml.safe_dump(check, sort_keys=False)
        )
    if found.max_replicas is None or found.target_in_flight_per_replica is None:
        return files
    documents = {
        "hpa.yaml": plan.hpa(found, name),
        "keda-scaledobject.yaml": plan.keda(found, name, sweep.spec.template.metrics.prometheus_url),
        "kserve-inferenceservice.yaml": plan.kserve(found, name),
        "ray-serve-autoscaling.yaml": plan.ray_serve(found, name),
    }
    for file, document in documents.items():
        files[file] = header + document.as_yaml()
    return files


def write_best(sweep: ServingSweep, config: TrialConfig, folder: Path, best: SweepBest | None = None) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in best_files(sweep, config, best).items():
        (folder / name).write_text(text)
        written.append(folder / name)
    return written
