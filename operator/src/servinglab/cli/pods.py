"""The commands the chart's pods run: the operator and its health check, the CRDs, the model and form
preparation of the server pod's init containers, and the load Job (`loadtest`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import click

from servinglab.api import ServerKind, load_experiment
from servinglab.api.exitcodes import ExitCode
from servinglab.api.reasons import Reason
from servinglab.api.results import to_json
from servinglab.cli.common import console, fail, main


@main.command()
@click.option("--namespace", "-n", "namespaces", multiple=True, help="Watch these namespaces (repeatable).")
@click.option("--all-namespaces", "-A", is_flag=True, help="Watch every namespace.")
@click.option("--liveness", default="http://0.0.0.0:8080/healthz", show_default=True, help="Health endpoint.")
def operator(namespaces: tuple[str, ...], all_namespaces: bool, liveness: str) -> None:
    """Run the ServingExperiment and ServingSweep operator (kopf) against the current cluster."""
    if not namespaces and not all_namespaces:
        fail("choose --namespace NAME (repeatable) or --all-namespaces", ExitCode.INVALID)
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
        fail(str(exc), ExitCode.FAILED)
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
        _report(termination_log, f"{Reason.MODEL_CHECKSUM_MISMATCH}: {exc}")
        fail(f"{Reason.MODEL_CHECKSUM_MISMATCH}: {exc}", ExitCode.MODEL_UNSERVABLE)
    except (ValueError, RuntimeError) as exc:
        fail(str(exc), ExitCode.INVALID)
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
        fail("prepare-model is for a model.source; built-in models are built by build-model", ExitCode.INVALID)
    model = spec.model
    if whole_url := os.environ.get(MODEL_URL_ENV):  # the spec file (a ConfigMap) has the URL's query redacted
        try:
            model = model.model_copy(update={"source": spec.model.source.with_url(whole_url)})
        except ValueError as exc:
            _report(termination_log, f"{Reason.INVALID_SPEC}: {MODEL_URL_ENV}: {exc}")
            fail(f"{MODEL_URL_ENV}: {exc}", ExitCode.INVALID)
    try:
        described = servers.get(spec.server.kind).prepare_user_model(
            model, spec.server.precision, into, mounted, cache, count, spec.server.batch_size
        )
    except ModelError as exc:
        _report(termination_log, f"{exc.reason}: {exc}")
        fail(f"{exc.reason}: {exc}", ExitCode.MODEL_UNSERVABLE)
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
        fail(f"{directory}: no description from prepare-model ({exc})", ExitCode.INVALID)
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
        fail(f"{exc.reason}: {exc}", ExitCode.MODEL_UNSERVABLE)
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
@click.option(
    "--utilisation-source",
    metavar="JSON",
    help="For load.utilisationTarget: the Prometheus and the server pods' series to read (the operator's).",
)
def loadtest(termination_log: Path, **options: object) -> None:
    """Run only the load levels of an experiment against a running server (the load Job's command)."""
    from servinglab.k8s.loadjob import LoadJobOptions, run

    ending = run(LoadJobOptions(**options))  # type: ignore[arg-type]
    if termination_log.parent.is_dir():
        termination_log.write_text(ending.message[:4000])
    if ending.code != ExitCode.OK:
        fail(ending.message, ending.code)
    console.print(ending.message, highlight=False)
