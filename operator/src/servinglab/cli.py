"""The `servinglab` command: validate, build-model, run, loadtest, operator, check-operator, crd, results.

Only orchestration and presentation live here; every command delegates to a module that does the
work (spec, models, runner, loadgen). Commands that generate load are entered through
:mod:`servinglab.entry`, which imports Locust (gevent patching) before this module.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from servinglab import __version__
from servinglab.results import level_label, trust_checks
from servinglab.spec import SpecError, load_experiment

console = Console(stderr=True)
# Wide enough for the results table when output goes to a file or a CI log, not a terminal.
stdout = Console(width=None if sys.stdout.isatty() else 160)


@click.group()
@click.version_option(__version__, prog_name="servinglab")
def main() -> None:
    """Benchmark TorchServe configurations with numbers you can trust."""


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
def validate(file: Path) -> None:
    """Check an experiment or sweep file; exit 1 with every bad field named if it is invalid."""
    from servinglab.sweepspec import load_sweep, space_size

    try:
        if _kind_of(file) == "ServingSweep":
            sweep = load_sweep(file)
            size = space_size(sweep.spec) if sweep.spec.strategy != "list" else len(sweep.spec.configurations)
            click.echo(
                f"{file}: valid ServingSweep '{sweep.metadata.name}' ({sweep.spec.strategy}, {size} configurations)"
            )
            return
        experiment = load_experiment(file)
    except SpecError as exc:
        _fail(str(exc), code=1)
    click.echo(f"{file}: valid {experiment.kind} '{experiment.metadata.name}'")


def _kind_of(file: Path) -> str | None:
    """The `kind` a YAML file declares, without validating it (None when unreadable)."""
    import yaml

    try:
        document = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return document.get("kind") if isinstance(document, dict) else None


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True, help="Folder for trials and results.")
@click.option("--resume", is_flag=True, help="Continue the sweep already in --output (finished trials are kept).")
@click.option("--fresh-servers", is_flag=True, help="Start a new TorchServe per trial instead of reconfiguring one.")
def sweep(file: Path, output: Path, resume: bool, fresh_servers: bool) -> None:
    """Run a sweep on this machine: trials one after another on one TorchServe (reconfigured between
    them), the search choosing the next; then the table, the best configuration and its export."""
    from servinglab import runner
    from servinglab.sweep.local import SweepError, run_sweep
    from servinglab.sweepspec import load_sweep

    try:
        parsed = load_sweep(file)
    except SpecError as exc:
        _fail(str(exc), code=1)
    with _LoadProgress() as progress:
        hooks = runner.RunHooks(phase=progress.phase, progress=progress.update)
        try:
            document = run_sweep(
                parsed, output, resume, hooks, on_trial=lambda entry: progress.phase(_trial_line(entry))
            )
        except SweepError as exc:
            _fail(str(exc), code=2)
        except runner.Interrupted as exc:
            _fail(
                f"interrupted by {exc}; TorchServe stopped, finished trials kept in {output} (--resume continues)",
                code=128 + exc.signum,
            )
    print_sweep(document)
    console.print(
        f"sweep results in {output / 'sweep.json'}"
        + (f", best configuration in {output / 'best'}" if document["best"] else "")
    )


def _trial_line(entry: dict[str, Any]) -> str:
    capacity = entry.get("capacityRps")
    figure = f"{capacity:.1f} rps within the SLO" if capacity is not None else (entry.get("reason") or "-")
    return f"Trial {entry['name']}: {entry['state']}, {figure}"


def print_sweep(document: dict[str, Any]) -> None:
    """The sweep table: one row per trial, then the best configuration, the front and the stop reason."""
    objective = document.get("objective") or {}
    slo = objective.get("p99LatencyMs")
    title = f"{document['sweep']}: {document['model']}, {document['strategy']}" + (
        f", p99 <= {slo:g} ms" if slo else ""
    )
    table = Table(title=title, title_justify="left")
    for column in ("#", "batch", "delay", "workers", "precision", "state", "capacity rps", "p99 ms", "at", "ready s"):
        table.add_column(column, justify="right" if column not in ("precision", "state", "at") else "left")
    best = (document.get("best") or {}).get("trial")
    for entry in document["trials"]:
        config = entry["config"]
        state = entry["state"] if not entry.get("reason") else f"{entry['state']} ({entry['reason']})"
        ready = entry.get("readySeconds")
        row = [
            str(entry["order"] + 1) + (" *" if entry["name"] == best else ""),
            str(config["batchSize"]), str(config["maxBatchDelayMs"]), str(config["workers"]), config["precision"],
            state, _num(entry.get("capacityRps"), 1), _ms(entry.get("p99LatencyMs")), str(entry.get("level") or "-"),
            "-" if ready is None else f"{ready:.1f}" + (" (reconfigured)" if entry.get("reconfigured") else ""),
        ]  # fmt: skip
        table.add_row(*row)
    stdout.print(table)
    counts = document["counts"]
    notes = [f"{counts['run']} trials run of {document['gridSize']} configurations ({counts['pruned']} pruned)"]
    if document.get("best"):
        top = document["best"]
        config = top["config"]
        notes.append(
            f"best: batch {config['batchSize']}, delay {config['maxBatchDelayMs']} ms, {config['workers']} worker(s), "
            f"{config['precision']} at {top['capacityRps']:.1f} rps (p99 {_ms(top['p99LatencyMs'])} ms, {top['level']})"
        )
    else:
        notes.append("no configuration met the objective")
    notes.append(f"Pareto front: {len(document['front'])} points")
    notes.append(f"stopped: {document.get('stopReason') or 'not finished'}")
    stdout.print("; ".join(notes), highlight=False)


@main.command()
@click.option("--namespace", "-n", "namespaces", multiple=True, help="Watch these namespaces (repeatable).")
@click.option("--all-namespaces", "-A", is_flag=True, help="Watch every namespace.")
@click.option("--liveness", default="http://0.0.0.0:8080/healthz", show_default=True, help="Health endpoint.")
def operator(namespaces: tuple[str, ...], all_namespaces: bool, liveness: str) -> None:
    """Run the ServingExperiment operator (kopf) against the current cluster."""
    import kopf

    from servinglab.k8s import operator as handlers  # registers the handlers

    if not namespaces and not all_namespaces:
        _fail("choose --namespace NAME (repeatable) or --all-namespaces", code=2)
    # our own lines at INFO (leadership, progress); kopf's only from WARNING (a retried reconcile, say)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf").setLevel(logging.WARNING)
    handlers.LOG.info("servinglab operator starting")
    settings = kopf.OperatorSettings()
    # Watching named namespaces needs no cluster-wide list of namespaces or CRDs, so a namespaced
    # Role suffices (the Helm chart's default); cluster-wide, kopf keeps noticing CRD changes.
    settings.scanning.disabled = not all_namespaces
    # The leader-election Lease: in the first watched namespace, so any two operators watching the same
    # namespaces (a rollout surge, a second install) contend for the same Lease; cluster-wide, in
    # the operator's own namespace.
    if not os.environ.get("SERVINGLAB_LEASE_NAMESPACE"):
        first = min(namespaces) if namespaces else os.environ.get("POD_NAMESPACE", "default")
        os.environ["SERVINGLAB_LEASE_NAMESPACE"] = first
    os.environ["SERVINGLAB_LIVENESS_URL"] = liveness  # a standby answers it too (servinglab.k8s.leader)
    kopf.run(
        settings=settings,
        standalone=True,  # no kopf peering: the Lease (servinglab.k8s.leader) elects the one acting replica
        clusterwide=all_namespaces,
        namespaces=list(namespaces),
        liveness_endpoint=liveness,
        # kopf's default identity asks the passwd database for the user, which has no entry for the
        # image's UID 65532 (nor for the arbitrary UIDs some clusters assign): the pod's name will do
        identity=socket.gethostname(),  # type: ignore[arg-type]  # a NewType of str kopf does not export
    )


@main.command()
@click.argument("results_file", type=click.Path(path_type=Path, exists=True))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Folder for the page (default: FILE's name).")
def report(results_file: Path, out_dir: Path | None) -> None:
    """Render a results JSON as PNG plots and an HTML page (latency CDF, throughput/p99, breakdown);
    for a sweep's sweep.json: the Pareto plot, capacity heat maps and the trial table."""
    from servinglab.report import render

    try:
        document = json.loads(results_file.read_text())
    except ValueError as exc:
        _fail(f"{results_file}: not a results JSON ({exc})", code=1)
    if isinstance(document, dict) and document.get("kind") == "ServingSweepResults":
        from servinglab.sweep.report import render_sweep

        if not document.get("trials"):
            _fail(f"{results_file}: the sweep has no finished trials to report", code=1)
        click.echo(f"report: {render_sweep(document, out_dir or results_file.with_suffix(''))}")
        return
    if not isinstance(document, dict) or not document.get("results"):
        _fail(f"{results_file}: no results to report", code=1)
    page = render(document, out_dir or results_file.with_suffix(""))
    click.echo(f"report: {page}")


@main.command("check-operator")
@click.option("--health", "health_url", required=True, help="The operator's /healthz URL.")
@click.option("--metrics", "metrics_url", required=True, help="The operator's /metrics URL.")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds per request.")
def check_operator(health_url: str, metrics_url: str, timeout: float) -> None:
    """Exit 0 when the operator is healthy and serves its metrics (the chart's `helm test`)."""
    from servinglab.k8s.health import OperatorUnhealthy, check_operator

    try:
        families = check_operator(health_url, metrics_url, timeout)
    except OperatorUnhealthy as exc:
        _fail(str(exc), code=1)
    click.echo(f"operator healthy; {families} servinglab metric families served")


@main.command()
@click.option("--kind", type=click.Choice(["experiment", "sweep"]), default="experiment", show_default=True)
def crd(kind: str) -> None:
    """Print the ServingExperiment or ServingSweep CustomResourceDefinition (generated from the spec models)."""
    import yaml

    from servinglab.crd import crd_manifest, sweep_crd_manifest

    manifest = crd_manifest() if kind == "experiment" else sweep_crd_manifest()
    click.echo(yaml.safe_dump(manifest, sort_keys=False), nl=False)


@main.command("build-model")
@click.argument("name")
@click.option("--force", is_flag=True, help="Rebuild even if the inputs are unchanged.")
@click.option("--build-dir", type=click.Path(path_type=Path), help="Where archives go.")
@click.option("--quiet", is_flag=True, help="Print nothing when the archive is already current.")
@click.option("--termination-log", type=click.Path(path_type=Path),
              help="Write the model's description (JSON: parameters, FLOPs) here (the init container's).")  # fmt: skip
def build_model(name: str, force: bool, build_dir: Path | None, quiet: bool, termination_log: Path | None) -> None:
    """Build the TorchServe archive of a built-in model (rebuilt only when its inputs change)."""
    from servinglab import models

    try:
        archive, rebuilt = models.build(name, build_dir, force=force)
    except (ValueError, RuntimeError) as exc:
        _fail(str(exc), code=1)
    if rebuilt or not quiet:
        click.echo(f"{'built' if rebuilt else 'up to date'}: {archive}")
    if termination_log is not None and termination_log.parent.is_dir():
        termination_log.write_text(json.dumps(models.description(name, archive), separators=(",", ":")))


@main.command("prepare-model")
@click.option("--spec-file", type=click.Path(path_type=Path, exists=True), required=True)
@click.option("--into", type=click.Path(path_type=Path), required=True, help="The model's folder in the model store.")
@click.option("--mounted", type=click.Path(path_type=Path), help="Where a pvc source's claim is mounted.")
@click.option("--termination-log", type=click.Path(path_type=Path), default=Path("/dev/termination-log"),
              show_default=True, help="Where the outcome goes for Kubernetes (skipped if absent).")  # fmt: skip
def prepare_model(spec_file: Path, into: Path, mounted: Path | None, termination_log: Path) -> None:
    """Fetch, check and pack the experiment's own model into the model store (the server pod's init
    container). On success the termination message is the model's description (JSON, for the
    operator's status); on failure it is "<Reason>: <message>" and the exit code is 3."""
    import shutil
    import tempfile

    from servinglab import modelsource

    def report(message: str) -> None:
        if termination_log.parent.is_dir():
            termination_log.write_text(message[:4000])

    experiment = load_experiment(spec_file)
    model = experiment.spec.model
    if model.source is None:
        _fail("prepare-model is for a model.source; built-in models are built by build-model", code=1)
    workdir = Path(tempfile.mkdtemp(prefix="prepare-"))
    try:
        prepared = modelsource.prepare(model, experiment.spec.server.precision, workdir, mounted=mounted)
    except modelsource.ModelSourceError as exc:
        report(f"{exc.reason}: {exc}")
        _fail(f"{exc.reason}: {exc}", code=3)
    shutil.copytree(prepared.directory, into, dirs_exist_ok=True)
    report(json.dumps({k: v for k, v in prepared.info.items() if k != "input"}, separators=(",", ":")))
    click.echo(json.dumps(prepared.info))


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write the results JSON here.")
@click.option("--cluster", is_flag=True, help="Apply to the current kubeconfig's cluster and follow it.")
@click.option("--namespace", "-n", help="Namespace for --cluster (default: the file's, else 'default').")
@click.option("--timeout", default=3600.0, show_default=True, help="Seconds to follow a --cluster run.")
def run(file: Path, output: Path | None, cluster: bool, namespace: str | None, timeout: float) -> None:
    """Run an experiment: on this machine (TorchServe as a child process) or, with --cluster, by
    the operator; either way the same load test, table and results JSON."""
    try:
        experiment = load_experiment(file)
    except SpecError as exc:
        _fail(str(exc), code=1)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
    if cluster:
        _run_on_cluster(experiment, namespace or experiment.metadata.namespace or "default", timeout, output)
        return

    from servinglab import runner

    with _LoadProgress() as progress:
        hooks = runner.RunHooks(phase=progress.phase, progress=progress.update)
        try:
            document = runner.run_local(experiment, hooks)
        except runner.RunError as exc:
            _fail(f"experiment {experiment.metadata.name} failed: {exc}", code=2)
        except runner.Interrupted as exc:
            _fail(f"interrupted by {exc}; TorchServe stopped, nothing left running", code=128 + exc.signum)
    print_results(document)
    if output is not None:
        output.write_text(json.dumps(document, indent=2) + "\n")
        console.print(f"results written to {output}")


@main.command()
@click.option("--target", required=True, help="TorchServe inference URL, e.g. http://server:8080.")
@click.option("--model", "model_name", required=True, help="Model name (predictions path).")
@click.option("--spec-file", type=click.Path(path_type=Path, exists=True), required=True)
@click.option("--metrics-url", help="TorchServe metrics URL for the server-side breakdown.")
@click.option("--image-size", type=int, help="Payload size (defaults to the built-in model's).")
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Results JSON ('-' = stdout).")
@click.option("--results-configmap", help="Also write the results into this ConfigMap (in-cluster).")
@click.option(
    "--ready-timeout",
    default=600.0,
    show_default=True,
    help="Seconds to wait for the server to answer a first request before measuring.",
)
@click.option(
    "--termination-log",
    type=click.Path(path_type=Path),
    default=Path("/dev/termination-log"),
    show_default=True,
    help="Where a one-line outcome is written for Kubernetes (skipped if the folder does not exist).",
)
@click.option(
    "--flops-per-inference",
    type=float,
    help="The model's FLOPs per inference, as counted where it was prepared (spares counting them here).",
)
@click.option(
    "--payload-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("."),
    show_default=True,
    help="Folder the spec's payload files/records are relative to (a mounted ConfigMap or claim).",
)
@click.option(
    "--generators-listen",
    metavar="HOST:PORT",
    help="With spec.load.generators > 1, the first load pod takes the others' generators here.",
)
@click.option(
    "--generators-join",
    metavar="HOST:PORT",
    help="Where the other load pods join the first (their index comes from JOB_COMPLETION_INDEX).",
)
def loadtest(
    target: str,
    model_name: str,
    spec_file: Path,
    metrics_url: str | None,
    image_size: int | None,
    output: Path | None,
    results_configmap: str | None,
    ready_timeout: float,
    termination_log: Path,
    flops_per_inference: float | None,
    payload_dir: Path,
    generators_listen: str | None,
    generators_join: str | None,
) -> None:
    """Run only the load levels of an experiment against a running server (the Job's command)."""
    from servinglab import tsmetrics
    from servinglab.loadgen import generators, levels, results_sink, shapes
    from servinglab.loadgen.hooks import LevelHooks
    from servinglab.loadgen.payloads import PayloadError

    def finish(message: str, code: int) -> None:
        if termination_log.parent.is_dir():
            termination_log.write_text(message[:4000])
        if code:
            _fail(message, code)

    try:
        experiment = load_experiment(spec_file)
    except SpecError as exc:
        finish(str(exc), 1)
    load = experiment.spec.load
    # pods of one indexed Job share the spec file: its digest keeps other connections out
    authkey = hashlib.sha256(spec_file.read_bytes()).digest()
    index = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    if index > 0 and generators_join:  # one of the other load pods: a generator for the first
        # the first pod waits for the server (up to ready_timeout) before it takes generators
        problem = _generate_for(generators_join, authkey, ready_timeout + 120)
        finish(problem or f"load generator {index + 1} done", 6 if problem else 0)
        return
    try:
        destination = _load_target(experiment.spec, target, model_name, image_size, payload_dir)
    except (PayloadError, shapes.TraceError) as exc:
        finish(str(exc), 1)
    answered_at, problem = levels.wait_until_serving(destination, load.request_timeout_seconds, ready_timeout)
    if problem is not None:
        finish(problem, 5)
    windows = tsmetrics.WindowReader(tsmetrics.http_fetcher(metrics_url), model_name) if metrics_url else None
    hooks = LevelHooks(window_start=windows.window_start, window_end=windows.window_end) if windows else None
    try:
        remote = _other_generators(load, generators_listen, authkey, ready_timeout)
        outcome = levels.run_load(load, experiment.spec.slo.p99_latency_ms, destination, hooks, remote)
    except generators.GeneratorError as exc:
        finish(str(exc), 6)
    except OSError as exc:
        finish(f"reading TorchServe metrics failed: {exc}", 3)
    document = _load_document(experiment.spec, outcome, windows, answered_at, flops_per_inference)
    _write_json(document, output)
    if results_configmap:
        try:
            results_sink.write_results(results_configmap, document)
        except results_sink.SinkError as exc:
            finish(str(exc), 4)
    measured = outcome.levels
    requests, errors = sum(level.requests for level in measured), sum(level.errors for level in measured)
    finish(f"{len(measured)} levels measured, {requests} requests, {errors} errors", 0)


def _load_target(spec: Any, target: str, model_name: str, image_size: int | None, payload_dir: Path) -> Any:
    """Where the load goes and what it sends; a bad payload or trace raises before anything is sent.
    Files are read from the payload folder only, which must itself stay on its volume (a claim's folder
    that is a symlink out of the claim is refused)."""
    from servinglab import models
    from servinglab.loadgen import folder, levels, shapes
    from servinglab.loadgen.payloads import PayloadError, request_payloads

    load = spec.load
    if load.payload.pvc is not None:
        try:
            payload_dir = folder.within_volume(payload_dir, load.payload.pvc.path, "load.payload.pvc.path")
        except folder.FolderError as exc:
            raise PayloadError(str(exc)) from None
    size = image_size or models.request_image_size(spec.model, load.payload)
    payloads = request_payloads(load.payload, size, payload_dir)
    if load.shape is not None and load.shape.trace is not None:
        shapes.load_trace(load.shape.trace, payload_dir, len(payloads), load.stability.window_seconds)
    return levels.Target(target.rstrip("/"), f"/predictions/{model_name}", payloads, load.payload.check, payload_dir)


def _load_document(
    spec: Any, outcome: Any, windows: Any, answered_at: float | None, flops_per_inference: float | None
) -> dict[str, Any]:
    """The load Job's results: every level, with the server's breakdown when its metrics were read."""
    from servinglab import ceiling
    from servinglab.results import level_entries

    breakdowns = windows.breakdowns if windows is not None else {}
    entries = level_entries(outcome.levels, outcome.sweep_levels, breakdowns, None)
    if windows is None:
        for entry in entries:
            entry.pop("server", None)
    document: dict[str, Any] = {"serverAnsweredAt": answered_at, "results": entries}
    if outcome.peak is not None:
        document["peakRate"] = outcome.peak
    if spec.ceiling.enabled and (figures := ceiling.for_experiment(spec, entries, flops=flops_per_inference)):
        document["ceiling"] = figures
    return document


def _other_generators(load: Any, listen: str | None, authkey: bytes, timeout_seconds: float) -> list[Any]:
    """The other load pods' generators, once they have joined this (the first) pod."""
    from servinglab.loadgen import generators

    if not listen or not isinstance(load.generators, int) or load.generators == 1:
        return []
    return generators.accept_generators(_host_port(listen), load.generators - 1, authkey, timeout_seconds)


def _generate_for(coordinator: str, authkey: bytes, timeout_seconds: float) -> str | None:
    """Join the first load pod and generate its share of every level; why not, if it failed."""
    from servinglab.loadgen import generators

    try:
        generators.serve(generators.join_coordinator(_host_port(coordinator), authkey, timeout_seconds))
    except (generators.GeneratorError, EOFError, OSError) as exc:
        return f"load generator for {coordinator}: {exc}"
    return None


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _write_json(document: dict[str, Any], output: Path | None) -> None:
    """To the file, or to stdout when there is none or it is '-'."""
    text = json.dumps(document, indent=2) + "\n"
    if output is None or str(output) == "-":
        sys.stdout.write(text)
    else:
        output.write_text(text)


def _run_on_cluster(experiment: Any, namespace: str, timeout: float, output: Path | None) -> None:
    from servinglab.k8s import follow
    from servinglab.k8s.kube import KubeError

    try:
        body = follow.run_on_cluster(experiment, namespace, lambda line: console.print(line, highlight=False), timeout)
    except (KubeError, TimeoutError, LookupError) as exc:
        _fail(str(exc), code=2)
    _show_cluster_result(body, output)


def _show_cluster_result(body: dict[str, Any], output: Path | None) -> None:
    from servinglab.k8s import conditions as cond
    from servinglab.k8s import follow

    document = follow.status_document(body)
    if document["results"]:
        print_results(document)
    if output is not None:
        output.write_text(json.dumps(document, indent=2) + "\n")
    failed = cond.get(document["conditions"], cond.FAILED)
    if failed is not None and failed.get("status") == "True":
        _fail(f"{failed['reason']}: {failed['message']}", code=2)


@main.command()
@click.argument("name")
@click.option("--namespace", "-n", default="default", show_default=True)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write the results JSON here ('-' = stdout).")
@click.option("--sweep", "is_sweep", is_flag=True, help="NAME is a ServingSweep: its trial table and document.")
@click.option(
    "--export",
    "export_dir",
    type=click.Path(path_type=Path),
    help="With --sweep: write the best configuration here (experiment.yaml, config.properties, model-config.yaml).",
)
def results(name: str, namespace: str, output: Path | None, is_sweep: bool, export_dir: Path | None) -> None:
    """Print a cluster experiment's (or, with --sweep, a sweep's) results table from the API."""
    from servinglab.k8s import follow
    from servinglab.k8s.kube import KubeError

    if is_sweep:
        try:
            found = follow.fetch_sweep(namespace, name)
        except KubeError as exc:
            _fail(str(exc), code=2)
        if found is None:
            _fail(f"ServingSweep {namespace}/{name} not found", code=1)
        sweep, document = found
        print_sweep(document)
        if output is not None:
            _write_json(document, output)
        if export_dir is not None and document["best"] is not None:
            from servinglab.sweep.export import write_best
            from servinglab.sweepspec import TrialConfig

            write_best(sweep, TrialConfig.model_validate(document["best"]["config"]), export_dir)
            console.print(f"best configuration written to {export_dir}")
        return
    try:
        body = follow.fetch(namespace, name)
    except KubeError as exc:
        _fail(str(exc), code=2)
    if body is None:
        _fail(f"ServingExperiment {namespace}/{name} not found", code=1)
    if not (body.get("status") or {}).get("results"):
        state = ((body.get("status") or {}).get("summary") or {}).get("state", "Pending")
        console.print(f"{namespace}/{name}: {state}, no results yet")
    _show_cluster_result(body, output)


def print_results(document: dict[str, Any]) -> None:
    """The results table a person reads: one row per level, plus cold start and the best level."""
    server = document["server"]
    title = (
        f"{document['experiment']}: {document['model']} batch={server['batchSize']} "
        f"delay={server['maxBatchDelayMs']}ms workers={server['workers']} precision={server['precision']}"
    )
    table = Table(title=title, title_justify="left")
    for column in ("level", "rps", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "max ms"):
        table.add_column(column, justify="right")
    for column in ("requests", "errors", "batch", "queue ms", "infer ms/batch"):
        table.add_column(column, justify="right")
    slo = document.get("slo")
    if slo:
        table.add_column(f"p99≤{slo['p99LatencyMs']:g}", justify="center")
    table.add_column("checks", justify="left")
    warnings = []
    for entry in document["results"]:
        latency = entry["latencyMs"]
        breakdown = entry.get("server") or {}
        row = [
            level_label(entry) + (" (search)" if entry.get("peakSearchProbe") else ""),
            f"{entry['throughputRps']:.1f}",
            *(_ms(latency.get(k)) for k in ("p50", "p90", "p95", "p99", "max")),
            str(entry["requests"]),
            str(entry["errors"]),
            _num(breakdown.get("meanBatchSize"), 2),
            _num(breakdown.get("queueMsMean"), 1),
            _num(breakdown.get("inferenceMsPerBatch"), 1),
        ]
        if slo:
            row.append("yes" if entry.get("meetsSlo") else "no")
        marks, why = trust_checks(entry)
        row.append(" ".join(marks) or "-")
        warnings += [f"level {level_label(entry)}: {reason}" for reason in why]
        table.add_row(*row)
    stdout.print(table)
    for warning in warnings:
        stdout.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    warmup = f" (handler warm-up {document['warmupSeconds']:.1f} s)" if document.get("warmupSeconds") else ""
    notes = [f"cold start {document.get('coldStartSeconds') or 0:.1f} s{warmup}"]
    best = document.get("best")
    if best:
        notes.append(f"best: level {level_label(best)} at {best['throughputRps']:.1f} rps")
    peak = document.get("peakRate")
    if peak:
        if peak.get("rateRps") is not None:
            notes.append(
                f"peak rate within the SLO: {peak['rateRps']:g} rps (p99 {_ms(peak.get('p99LatencyMs'))} ms, "
                f"{peak['probes']} probes{'; ' + peak['note'] if peak.get('note') else ''})"
            )
        else:
            notes.append(f"peak rate: none found ({peak.get('note')})")
    ceiling = document.get("ceiling")
    if ceiling:
        notes.append(_ceiling_note(ceiling))
    precision_note = (document.get("runtime") or {}).get("precisionNote")
    if precision_note:
        notes.append(precision_note)
    stdout.print("; ".join(notes))


def _ceiling_note(ceiling: dict[str, Any]) -> str:
    parts = [f"ceiling: {ceiling['flopsPerInference'] / 1e9:.3g} GFLOPs/inference"]
    if ceiling.get("servedOverRaw") is not None:
        parts.append(
            f"served {ceiling['servedRps']:.1f} rps = {ceiling['servedOverRaw']:.0%} of the model alone at the "
            f"formed batch size {ceiling['rawBatchSize']} ({ceiling['rawAtFormedBatchRps']:.1f} rps in-process)"
        )
    if ceiling.get("servedOverBestRaw") is not None:
        parts.append(
            f"{ceiling['servedOverBestRaw']:.0%} of its best ({ceiling['rawBestRps']:.1f} rps at batch "
            f"{ceiling['rawBestBatchSize']})"
        )
    if ceiling.get("servedOverTheoretical") is not None:
        parts.append(
            f"{ceiling['servedOverTheoretical']:.3g} of the {ceiling['accelerator']} peak "
            f"({ceiling['theoreticalRps']:.0f} rps at {ceiling['peakTflops']:g} TFLOPS)"
        )
    elif ceiling.get("note"):
        parts.append(ceiling["note"])
    return ", ".join(parts)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fail(message: str, code: int) -> NoReturn:
    # not wrapped: a message naming a long path stays one greppable line in logs and pipes
    console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    sys.exit(code)


class _LoadProgress:
    """Load progress: live bars on a terminal; one line per phase change in logs and pipes."""

    def __init__(self) -> None:
        self._live = console.is_terminal
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeRemainingColumn(),
            console=console,
            auto_refresh=False,  # refreshed from the load loop: no extra thread beside gevent
            disable=not self._live,
        )
        self._tasks: dict[tuple[str, str], Any] = {}

    def __enter__(self) -> _LoadProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def phase(self, message: str) -> None:
        console.print(message, highlight=False)
        self._progress.refresh()

    def update(self, level: str, phase: str, done: float, planned: float, measured: int) -> None:
        key = (level, phase)
        if phase == "drain":
            return
        if key not in self._tasks:
            verb = {"warmup": "warm-up", "measure": "measuring", "extend": "extending (unstable)"}.get(phase, phase)
            self._tasks[key] = self._progress.add_task(f"{level:<8} {verb}", total=planned or 1, detail="")
            self._line(f"{level}: {verb} for {planned:g} s")
        detail = f"{measured} req" if phase == "measure" else ""
        self._progress.update(self._tasks[key], completed=done, detail=detail)
        self._progress.refresh()

    def _line(self, message: str) -> None:
        if not self._live:
            console.print(message, highlight=False)
