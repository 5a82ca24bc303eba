"""The commands people type: validate, run and sweep (locally, or `run --cluster`), results and report."""

from __future__ import annotations

import json
from pathlib import Path

import click
from pydantic import ValidationError

from servinglab.api import SWEEP_KIND, SpecError, load_experiment, read_document
from servinglab.api.exitcodes import ExitCode, interrupted
from servinglab.cli.common import console, fail, main, price_option, say, write_json


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@price_option
def validate(file: Path, price_per_hour: float | None) -> None:
    """Check an experiment or sweep file; exit 1 with every bad field named if it is invalid."""
    from servinglab.api import load_sweep, space_size

    try:
        if _kind_of(file) == SWEEP_KIND:
            sweep = load_sweep(file, price_per_hour)
            size = space_size(sweep.spec)
            what = f"({sweep.spec.strategy}, {size} configurations)"
            click.echo(f"{file}: valid {SWEEP_KIND} '{sweep.metadata.name}' {what}")
            return
        experiment = load_experiment(file, price_per_hour)
    except SpecError as exc:
        fail(str(exc), ExitCode.INVALID)
    click.echo(f"{file}: valid {experiment.kind} '{experiment.metadata.name}'")


def _kind_of(file: Path) -> str | None:
    """The `kind` a file declares, without validating it (None when unreadable)."""
    try:
        document = read_document(file)
    except SpecError:
        return None
    return document.get("kind") if isinstance(document, dict) else None


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write the results JSON here.")
@click.option("--cluster", is_flag=True, help="Apply to the current kubeconfig's cluster and follow it.")
@click.option("--namespace", "-n", help="Namespace for --cluster (default: the file's, else 'default').")
@click.option("--timeout", default=3600.0, show_default=True, help="Seconds to follow a --cluster run.")
@price_option
def run(file: Path, output: Path | None, cluster: bool, namespace: str | None, timeout: float,
        price_per_hour: float | None) -> None:  # fmt: skip
    """Run an experiment: on this machine (the server as a child process) or, with --cluster, by the
    operator; either way the same load test, table and results JSON."""
    try:
        experiment = load_experiment(file, price_per_hour)
    except SpecError as exc:
        fail(str(exc), ExitCode.INVALID)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
    if cluster:
        from servinglab.k8s import follow
        from servinglab.k8s.client import KubeError

        target = namespace or experiment.metadata.namespace or "default"
        try:
            found = follow.run_on_cluster(experiment, target, say, timeout)
        except (KubeError, TimeoutError, LookupError) as exc:
            fail(str(exc), ExitCode.FAILED)
        _show_cluster_result(found, output)
        return

    from servinglab import servers
    from servinglab.local import runner
    from servinglab.present.progress import LoadProgress
    from servinglab.present.tables import print_results

    with LoadProgress() as progress:
        hooks = runner.RunHooks(phase=progress.phase, progress=progress.update)
        try:
            document = runner.run_local(experiment, hooks)
        except runner.RunError as exc:
            fail(f"experiment {experiment.metadata.name} failed: {exc}", ExitCode.FAILED)
        except runner.Interrupted as exc:
            stopped = servers.get(experiment.spec.server.kind).name
            fail(f"interrupted by {exc}; {stopped} stopped, nothing left running", interrupted(exc.signum))
    print_results(document)
    if output is not None:
        write_json(document, output)
        console.print(f"results written to {output}")


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True, help="Folder for trials and results.")
@click.option("--resume", is_flag=True, help="Continue the sweep already in --output (finished trials are kept).")
@click.option("--fresh-servers", is_flag=True, help="Start a new server per trial instead of reconfiguring one.")
@price_option
def sweep(file: Path, output: Path, resume: bool, fresh_servers: bool, price_per_hour: float | None) -> None:
    """Run a sweep on this machine: trials one after another on one server (reconfigured between them
    where it can be), the search choosing the next; then the table, the best configuration and its export."""
    from servinglab import servers
    from servinglab.api import load_sweep
    from servinglab.local import runner
    from servinglab.local.sweep import SweepError, run_sweep
    from servinglab.present.progress import LoadProgress
    from servinglab.present.tables import print_sweep, trial_line

    try:
        parsed = load_sweep(file, price_per_hour)
    except SpecError as exc:
        fail(str(exc), ExitCode.INVALID)
    with LoadProgress() as progress:
        hooks = runner.RunHooks(phase=progress.phase, progress=progress.update)
        try:
            document = run_sweep(parsed, output, resume, hooks, lambda record: progress.phase(trial_line(record)),
                                 fresh_servers)  # fmt: skip
        except SweepError as exc:
            fail(str(exc), ExitCode.FAILED)
        except runner.Interrupted as exc:
            fail(
                f"interrupted by {exc}; {servers.get(parsed.spec.template.server.kind).name} stopped, finished trials "
                f"kept in {output} (--resume continues)",
                interrupted(exc.signum),
            )
    print_sweep(document)
    best = f", best configuration in {output / 'best'}" if document.best is not None else ""
    console.print(f"sweep results in {output / 'sweep.json'}{best}")


@main.command()
@click.argument("name")
@click.option("--namespace", "-n", default="default", show_default=True)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write the results JSON here ('-' = stdout).")
@click.option("--sweep", "is_sweep", is_flag=True, help="NAME is a ServingSweep: its trial table and document.")
@click.option(
    "--export",
    "export_dir",
    type=click.Path(path_type=Path),
    help="With --sweep: write the best configuration here (the experiment and the server's own files).",
)
def results(name: str, namespace: str, output: Path | None, is_sweep: bool, export_dir: Path | None) -> None:
    """Print a cluster experiment's (or, with --sweep, a sweep's) results table from the API."""
    from servinglab.k8s import follow
    from servinglab.k8s.client import KubeError
    from servinglab.present.tables import print_sweep

    try:
        found = follow.fetch_sweep(namespace, name) if is_sweep else follow.fetch(namespace, name)
    except KubeError as exc:
        fail(str(exc), ExitCode.FAILED)
    if found is None:
        fail(f"{SWEEP_KIND if is_sweep else 'ServingExperiment'} {namespace}/{name} not found", ExitCode.INVALID)
    if isinstance(found, follow.ClusterExperiment):
        if not found.results.results:
            console.print(f"{namespace}/{name}: {found.state or 'Pending'}, no results yet")
        _show_cluster_result(found, output)
        return
    print_sweep(found.results)
    if output is not None:
        write_json(found.results, output)
    if export_dir is not None and found.results.best is not None:
        from servinglab.sweep.export import write_best

        write_best(found.sweep, found.results.best.config, export_dir, found.results.best)
        console.print(f"best configuration written to {export_dir}")


def _show_cluster_result(found: object, output: Path | None) -> None:
    from servinglab.k8s.follow import ClusterExperiment
    from servinglab.present.tables import print_results

    assert isinstance(found, ClusterExperiment)
    if found.results.results:
        print_results(found.results)
    if output is not None:
        write_json(found.results, output)
    if found.failure is not None:
        fail(found.failure, ExitCode.FAILED)


@main.command()
@click.argument("results_file", type=click.Path(path_type=Path, exists=True))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Folder for the page (default: FILE's name).")
def report(results_file: Path, out_dir: Path | None) -> None:
    """Render a results JSON (an experiment's or a sweep's) as PNG plots and an HTML page."""
    from servinglab.api.results import ExperimentResults
    from servinglab.api.trials import SWEEP_RESULTS_KIND, SweepResults

    try:
        raw = json.loads(results_file.read_text())
        if isinstance(raw, dict) and raw.get("kind") == SWEEP_RESULTS_KIND:
            from servinglab.present.sweep_report import render_sweep

            swept = SweepResults.model_validate(raw)
            if not swept.trials:
                fail(f"{results_file}: the sweep has no finished trials to report", ExitCode.INVALID)
            click.echo(f"report: {render_sweep(swept, out_dir or results_file.with_suffix(''))}")
            return
        if not isinstance(raw, dict) or not raw.get("results"):
            fail(f"{results_file}: no results to report", ExitCode.INVALID)
        document = ExperimentResults.model_validate(raw)
    except (ValueError, ValidationError) as exc:
        fail(f"{results_file}: not a results JSON ({str(exc).splitlines()[0]})", ExitCode.INVALID)
    from servinglab.present.report import render

    click.echo(f"report: {render(document, out_dir or results_file.with_suffix(''))}")
