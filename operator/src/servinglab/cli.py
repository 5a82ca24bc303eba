"""The `servinglab` command: each command parses its arguments, calls one function, prints, and exits with
a named code (:class:`~servinglab.api.exitcodes.ExitCode`).

The work is elsewhere: the local wing (:mod:`servinglab.local`), the Kubernetes wing
(:mod:`servinglab.k8s`), the model store (:mod:`servinglab.models`), what people read
(:mod:`servinglab.present`). Commands that generate load are entered through :mod:`servinglab.entry`,
which imports Locust (gevent patching) before this module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn, get_args

import click
from pydantic import BaseModel, ValidationError
from rich.console import Console

from servinglab import __version__
from servinglab.api import SWEEP_KIND, ServerKind, SpecError, load_experiment, read_document
from servinglab.api.cost import MAX_PRICE_PER_HOUR
from servinglab.api.exitcodes import ExitCode, interrupted
from servinglab.api.results import to_json

console = Console(stderr=True)


@click.group()
@click.version_option(__version__, prog_name="servinglab")
def main() -> None:
    """Which server configuration serves this model best within its SLO: measured, with numbers you can
    trust."""


#: `--price-per-hour`: a replica's price per hour, which overrides the spec's `cost` (the template's, in a sweep).
_price_option = click.option(
    "--price-per-hour", type=click.FloatRange(min=0, min_open=True, max=MAX_PRICE_PER_HOUR),
    help="What one server replica costs per hour (overrides spec.cost.pricePerHour): each level's cost per million.",
)  # fmt: skip


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@_price_option
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
        _fail(str(exc), ExitCode.INVALID)
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
@_price_option
def run(file: Path, output: Path | None, cluster: bool, namespace: str | None, timeout: float,
        price_per_hour: float | None) -> None:  # fmt: skip
    """Run an experiment: on this machine (the server as a child process) or, with --cluster, by the
    operator; either way the same load test, table and results JSON."""
    try:
        experiment = load_experiment(file, price_per_hour)
    except SpecError as exc:
        _fail(str(exc), ExitCode.INVALID)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
    if cluster:
        from servinglab.k8s import follow
        from servinglab.k8s.client import KubeError

        target = namespace or experiment.metadata.namespace or "default"
        try:
            found = follow.run_on_cluster(experiment, target, _say, timeout)
        except (KubeError, TimeoutError, LookupError) as exc:
            _fail(str(exc), ExitCode.FAILED)
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
            _fail(f"experiment {experiment.metadata.name} failed: {exc}", ExitCode.FAILED)
        except runner.Interrupted as exc:
            stopped = servers.get(experiment.spec.server.kind).name
            _fail(f"interrupted by {exc}; {stopped} stopped, nothing left running", interrupted(exc.signum))
    print_results(document)
    if output is not None:
        _write_json(document, output)
        console.print(f"results written to {output}")


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True, help="Folder for trials and results.")
@click.option("--resume", is_flag=True, help="Continue the sweep already in --output (finished trials are kept).")
@click.option("--fresh-servers", is_flag=True, help="Start a new server per trial instead of reconfiguring one.")
@_price_option
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
        _fail(str(exc), ExitCode.INVALID)
    with LoadProgress() as progress:
        hooks = runner.RunHooks(phase=progress.phase, progress=progress.update)
        try:
            document = run_sweep(parsed, output, resume, hooks, lambda record: progress.phase(trial_line(record)),
                                 fresh_servers)  # fmt: skip
        except SweepError as exc:
            _fail(str(exc), ExitCode.FAILED)
        except runner.Interrupted as exc:
            _fail(
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
        _fail(str(exc), ExitCode.FAILED)
    if found is None:
        _fail(f"{SWEEP_KIND if is_sweep else 'ServingExperiment'} {namespace}/{name} not found", ExitCode.INVALID)
    if isinstance(found, follow.ClusterExperiment):
        if not found.results.results:
            console.print(f"{namespace}/{name}: {found.state}, no results yet")
        _show_cluster_result(found, output)
        return
    print_sweep(found.results)
    if output is not None:
        _write_json(found.results, output)
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
        _write_json(found.results, output)
    if found.failure is not None:
        _fail(found.failure, ExitCode.FAILED)


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
                _fail(f"{results_file}: the sweep has no finished trials to report", ExitCode.INVALID)
            click.echo(f"report: {render_sweep(swept, out_dir or results_file.with_suffix(''))}")
            return
        if not isinstance(raw, dict) or not raw.get("results"):
            _fail(f"{results_file}: no results to report", ExitCode.INVALID)
        document = ExperimentResults.model_validate(raw)
    except (ValueError, ValidationError) as exc:
        _fail(f"{results_file}: not a results JSON ({str(exc).splitlines()[0]})", ExitCode.INVALID)
    from servinglab.present.report import render

    click.echo(f"report: {render(document, out_dir or results_file.with_suffix(''))}")


@main.command()
@click.option("--namespace", "-n", "namespaces", multiple=True, help="Watch these namespaces (repeatable).")
@click.option("--all-namespaces", "-A", is_flag=True, help="Watch every namespace.")
@click.option("--liveness", default="http://0.0.0.0:8080/healthz", show_default=True, help="Health endpoint.")
def operator(namespaces: tuple[str, ...], all_namespaces: bool, liveness: str) -> None:
    """Run the ServingExperiment and ServingSweep operator (kopf) against the current cluster."""
    if not namespaces and not all_namespaces:
        _fail("choose --namespace NAME (repeatable) or --all-namespaces", ExitCode.INVALID)
    from servinglab.k8s.main import run_operator

    run_operator(list(namespaces), all_namespaces, liveness)


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
        _fail(str(exc), ExitCode.FAILED)
    click.echo(f"operator healthy; {families} servinglab metric families served")


@main.command()
@click.option("--kind", type=click.Choice(["experiment", "sweep"]), default="experiment", show_default=True)
def crd(kind: str) -> None:
    """Print the ServingExperiment or ServingSweep CustomResourceDefinition (generated from the API models)."""
    import yaml

    from servinglab.api.crd import crd_manifest, sweep_crd_manifest

    manifest = crd_manifest() if kind == "experiment" else sweep_crd_manifest()
    click.echo(yaml.safe_dump(manifest, sort_keys=False), nl=False)


@main.command("build-model")
@click.argument("name")
@click.option("--force", is_flag=True, help="Rebuild even if the inputs are unchanged.")
@click.option("--build-dir", type=click.Path(path_type=Path), help="Where builds go.")
@click.option("--into", type=click.Path(path_type=Path),
              help="Copy the build here (checked against its digests), laid out for --server.")  # fmt: skip
@click.option("--server", "kind", type=click.Choice(list(get_args(ServerKind))), default=get_args(ServerKind)[0],
              show_default=True, help="The server --into lays the build out for.")  # fmt: skip
@click.option("--quiet", is_flag=True, help="Print nothing when the build is already current.")
@click.option("--termination-log", type=click.Path(path_type=Path),
              help="Write the model's description (JSON: parameters, FLOPs) here (the init container's).")  # fmt: skip
def build_model(name: str, force: bool, build_dir: Path | None, into: Path | None, kind: str, quiet: bool,
                termination_log: Path | None) -> None:  # fmt: skip
    """Build a built-in model (seeded weights, counts; rebuilt only when its inputs change, or when the build
    differs from its digests). A copy that differs from them exits 3 with ModelChecksumMismatch."""
    from servinglab import servers
    from servinglab.models import builtins
    from servinglab.models.build import build

    try:
        folder, rebuilt = build(name, build_dir, force=force)
        if into is not None:
            servers.get(kind).layout_builtin(name, builtins.install(name, into, build_dir), into)  # type: ignore[arg-type]
    except builtins.BuildChanged as exc:
        _report(termination_log, f"ModelChecksumMismatch: {exc}")
        _fail(f"ModelChecksumMismatch: {exc}", ExitCode.MODEL_UNSERVABLE)
    except (ValueError, RuntimeError) as exc:
        _fail(str(exc), ExitCode.INVALID)
    if rebuilt or not quiet:
        click.echo(f"{'built' if rebuilt else 'up to date'}: {folder}")
    _report(termination_log, to_json(builtins.description(name, folder)))


@main.command("prepare-model")
@click.option("--spec-file", type=click.Path(path_type=Path, exists=True), required=True)
@click.option("--into", type=click.Path(path_type=Path), required=True, help="The model's folder in the model store.")
@click.option("--mounted", type=click.Path(path_type=Path), help="Where a pvc source's claim is mounted.")
@click.option("--cache", type=click.Path(path_type=Path), help="Where downloads are kept by digest (default: none).")
@click.option("--count/--no-count", default=True, show_default=True,
              help="Count a packed model's parameters and FLOPs (this loads it: not on Kubernetes).")  # fmt: skip
@click.option("--termination-log", type=click.Path(path_type=Path), default=Path("/dev/termination-log"),
              show_default=True, help="Where the outcome goes for Kubernetes (skipped if absent).")  # fmt: skip
def prepare_model(spec_file: Path, into: Path, mounted: Path | None, cache: Path | None, count: bool,
                  termination_log: Path) -> None:  # fmt: skip
    """Fetch, check and lay out the experiment's own model in the model store (the server pod's first init
    container). Runs nothing of the user's. On success the termination message is the model's description
    (JSON, for the operator's status); on failure it is "<Reason>: <message>" and the exit code is 3."""
    import os

    from servinglab import servers
    from servinglab.models.fetch import MODEL_URL_ENV
    from servinglab.servers.base import ModelError

    spec = load_experiment(spec_file).spec
    if spec.model.source is None:
        _fail("prepare-model is for a model.source; built-in models are built by build-model", ExitCode.INVALID)
    model = spec.model
    if whole_url := os.environ.get(MODEL_URL_ENV):  # the spec file (a ConfigMap) has the URL's query redacted
        try:
            model = model.model_copy(update={"source": spec.model.source.with_url(whole_url)})
        except ValueError as exc:
            _report(termination_log, f"InvalidSpec: {MODEL_URL_ENV}: {exc}")
            _fail(f"{MODEL_URL_ENV}: {exc}", ExitCode.INVALID)
    try:
        described = servers.get(spec.server.kind).prepare_user_model(
            model, spec.server.precision, into, mounted, cache, count, spec.server.batch_size
        )
    except ModelError as exc:
        _report(termination_log, f"{exc.reason}: {exc}")
        _fail(f"{exc.reason}: {exc}", ExitCode.MODEL_UNSERVABLE)
    _report(termination_log, to_json(described.model_copy(update={"input": None})))
    click.echo(json.dumps(to_json(described)))


@main.command("count-model")
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--termination-log", type=click.Path(path_type=Path), default=Path("/dev/termination-log"),
              show_default=True, help="Where the counts go for Kubernetes (skipped if absent).")  # fmt: skip
def count_model(directory: Path, termination_log: Path) -> None:
    """Count the parameters, FLOPs and bytes moved of the packed model prepare-model laid out in DIRECTORY (the
    server pod's second init container: it loads the user's model, so it has no cache, claim or credentials,
    and the model store read-only). Prints, and leaves as the termination message, {"parameters",
    "flopsPerInference", "weightBytes", "activationBytes", "countNote"} ({} for an archive, which is not
    counted); a model that does not load
    is a count of null with the reason, never a failure."""
    from servinglab.models import probe
    from servinglab.models.catalogue import INFO_FILE, PACKED_FORMATS

    try:
        described = json.loads((directory / INFO_FILE).read_text())
    except (OSError, ValueError) as exc:
        _fail(f"{directory}: no description from prepare-model ({exc})", ExitCode.INVALID)
    packed = isinstance(described, dict) and described.get("format") in PACKED_FORMATS
    counts = probe.count(directory) if packed else {}
    _report(termination_log, counts)
    click.echo(json.dumps(counts))


@main.command("prepare-form")
@click.option("--spec-file", type=click.Path(path_type=Path, exists=True), required=True)
@click.option("--folder", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True,
              help="The folder the handler loads the model from (Triton: the entry's 1/build).")  # fmt: skip
@click.option("--cache", type=click.Path(path_type=Path), help="Where built forms are kept, keyed by content.")
@click.option("--merge", is_flag=True,
              help="Add the form as `form` to the JSON object in the termination log (the model's).")  # fmt: skip
@click.option("--termination-log", type=click.Path(path_type=Path), default=Path("/dev/termination-log"),
              show_default=True, help="Where the outcome goes for Kubernetes (skipped if absent).")  # fmt: skip
def prepare_form(spec_file: Path, folder: Path, cache: Path | None, merge: bool, termination_log: Path) -> None:
    """Build (or find built), gate against eager fp32 and put beside the model the spec's `server.form`, as
    `servinglab run` does before its server starts (a server pod's init container). On success the
    termination message is the form run (JSON; with --merge, under `form` in the model's description); on
    failure "<Reason>: <message>" (FormDisagrees, FormNotBuilt, FormNotSupported) and the exit code is 3."""
    from servinglab.models import forms
    from servinglab.servers.handler import powers_of_two_up_to
    from servinglab.servers.process import visible_gpus

    server = load_experiment(spec_file).spec.server
    try:
        run = forms.prepare(server, folder, powers_of_two_up_to(server.batch_size), visible_gpus() > 0, cache)
    except forms.FormError as exc:
        _report(termination_log, f"{exc.reason}: {exc}")
        _fail(f"{exc.reason}: {exc}", ExitCode.MODEL_UNSERVABLE)
    said = to_json(run) if run is not None else {}
    if merge:
        try:
            described = json.loads(termination_log.read_text())
        except (OSError, ValueError):
            described = None
        said = {**described, "form": said} if isinstance(described, dict) else {"form": said}
    _report(termination_log, said)
    click.echo(json.dumps(said))


def _report(termination_log: Path | None, message: str | dict[str, object]) -> None:
    """A one-line outcome for Kubernetes (a JSON object, or "<Reason>: <message>"), when there is a log."""
    if termination_log is not None and termination_log.parent.is_dir():
        text = message if isinstance(message, str) else json.dumps(message, separators=(",", ":"))
        termination_log.write_text(text[:4000])


@main.command()
@click.option("--target", required=True, help="The server's inference URL, e.g. http://server:8080.")
@click.option("--model", "model_name", required=True, help="Model name (the request path comes from the server).")
@click.option("--spec-file", type=click.Path(path_type=Path, exists=True), required=True)
@click.option("--metrics-url", help="The server's metrics URL, for the server-side breakdown.")
@click.option("--image-size", type=int, help="Payload size (defaults to the built-in model's).")
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Results JSON ('-' = stdout).")
@click.option("--results-configmap", help="Also write the results into this ConfigMap (in-cluster).")
@click.option("--ready-timeout", default=600.0, show_default=True,
              help="Seconds to wait for the server to answer a first request before measuring.")  # fmt: skip
@click.option(
    "--termination-log",
    type=click.Path(path_type=Path),
    default=Path("/dev/termination-log"),
    show_default=True,
    help="Where a one-line outcome is written for Kubernetes (skipped if the folder does not exist).",
)
@click.option("--flops-per-inference", type=float,
              help="The model's FLOPs per inference, as counted where it was prepared (for the ceiling).")  # fmt: skip
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
    help="With spec.load.generators > 1, the first load pod takes the others' generators here "
    "(each proves it holds the key in SERVINGLAB_GENERATOR_KEY).",
)
@click.option(
    "--generators-join",
    metavar="HOST:PORT",
    help="Where the other load pods join the first (their index comes from JOB_COMPLETION_INDEX).",
)
def loadtest(termination_log: Path, **options: object) -> None:
    """Run only the load levels of an experiment against a running server (the load Job's command)."""
    from servinglab.k8s.loadjob import LoadJobOptions, run

    ending = run(LoadJobOptions(**options))  # type: ignore[arg-type]
    if termination_log.parent.is_dir():
        termination_log.write_text(ending.message[:4000])
    if ending.code != ExitCode.OK:
        _fail(ending.message, ending.code)
    console.print(ending.message, highlight=False)


def _say(line: str) -> None:
    console.print(line, highlight=False)


def _write_json(document: BaseModel, output: Path) -> None:
    """To the file, or to stdout when it is '-'."""
    text = json.dumps(to_json(document), indent=2) + "\n"
    if str(output) == "-":
        sys.stdout.write(text)
    else:
        output.write_text(text)


def _fail(message: str, code: int) -> NoReturn:
    # not wrapped: a message naming a long path stays one greppable line in logs and pipes
    console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    sys.exit(code)
