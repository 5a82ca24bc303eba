"""The ServingSweep v1alpha1 spec: many configurations of one experiment, searched for the best.

A sweep is a `template` experiment spec plus the server settings to vary: a `space` of axes
(batch size, max batch delay, workers, precision, the handler's data path: decode, decode threads,
transfer, pinned copies, compile mode, channels-last; the model's `form`; and the server `kind`) searched
by `grid` (every combination) or by `search` (far fewer trials, :mod:`servinglab.sweep.search`), or an explicit list of
`configurations`. Every trial is the template with one configuration applied; the objective is the
highest throughput that meets the template's SLO. Validation names every bad field like the
experiment's (:func:`parse_sweep`), including values of an axis that the experiment would refuse.

The `kind` axis is not one more dimension of one lattice: the other knobs mean different things on each
server (LitServe's batch timeout runs from when its worker starts collecting, TorchServe's delay from the
first request; LitServe's workers each bring an API process along), so each kind is a space of its own —
the shared axes, or its own ones under `space.perKind.<kind>` — searched on its own to its own best.

Used by `servinglab sweep` (local), the sweep reconciler (cluster) and the CRD generator.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from servinglab.api.capacity import CapacitySpec
from servinglab.api.cost import with_price
from servinglab.api.datapath import DataPath
from servinglab.api.experiment import ExperimentSpec
from servinglab.api.meta import ObjectMeta, SpecModel, describe_error, parse_document, read_document
from servinglab.api.servers import Precision, ServerKind, ServerSpec
from servinglab.api.space import DATA_PATH_AXES, IntAxis, KnobSpace, SweepSpace
from servinglab.api.trialconfig import (
    ConfigKey,
    ConfirmSpec,
    ObjectiveSpec,
    StopSpec,
    TrialConfig,
    Variant,
)

#: A space larger than this is refused: at a minute or more per trial it would run for days.
MAX_SPACE = 512
#: The validation context's key that says the trials are priced where they run (:func:`parse_sweep`).
PRICES_ELSEWHERE = "pricesElsewhere"

AXES = ("batchSize", "maxBatchDelayMs", "workers", "precision", "decode", "decodeThreads", "transfer", "pinnedCopies",
        "compile", "channelsLast", "form", "kind")  # fmt: skip


class SweepSpec(SpecModel):
    """`spec` of a ServingSweep."""

    template: ExperimentSpec
    strategy: Literal["grid", "search", "list"] = Field(
        default="search",
        description="grid: every combination; search: hill-climbing with precision screening and pruning; "
        "list: exactly `configurations`, in order.",
    )
    space: SweepSpace = Field(default_factory=SweepSpace)
    configurations: list[TrialConfig] = Field(default_factory=list, max_length=MAX_SPACE)
    max_trials: int | None = Field(default=None, ge=1, le=MAX_SPACE, description="At most this many trials run.")
    stop: StopSpec = Field(default_factory=StopSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    confirm: ConfirmSpec = Field(default_factory=ConfirmSpec)
    capacity: CapacitySpec | None = Field(
        default=None,
        description="The peak rate the winner must serve and the headroom kept: the exported capacity plan "
        "(replicas, autoscaler targets).",
    )
    guided: bool = Field(
        default=True,
        description="search: try first the axis each trial's bottleneck verdict points at, and stop at the model's "
        "raw ceiling (false: the fixed neighbour order, for comparison).",
    )
    parallelism: int = Field(default=1, ge=1, le=16, description="Trials that may run at once (on the cluster).")

    @model_validator(mode="before")
    @classmethod
    def _listed_keep_the_templates_data_path(cls, data: Any) -> Any:
        """A listed configuration that names no dataPath runs the template's (not the handler's default)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("configurations"), list):
            return data
        template = data.get("template")
        server = template.get("server") if isinstance(template, Mapping) else None
        path = server.get("dataPath", server.get("data_path")) if isinstance(server, Mapping) else None
        if path is None:
            return data
        listed = [
            {**config, "dataPath": path} if isinstance(config, Mapping) and not {"dataPath", "data_path"} & set(config)
            else config
            for config in data["configurations"]
        ]  # fmt: skip
        return {**data, "configurations": listed}

    @model_validator(mode="after")
    def _a_space_to_search(self) -> SweepSpec:
        if self.strategy == "list" and not self.configurations:
            raise ValueError("strategy list needs configurations")
        if self.strategy != "list" and self.configurations:
            raise ValueError("configurations need strategy: list")
        if self.strategy != "list" and not any(getattr(self.space, f) for f in SweepSpace.model_fields):
            raise ValueError(f"space: vary at least one of {', '.join(AXES)}")
        if self.strategy != "list" and not data_paths(self):
            raise ValueError("space: every combination of the data-path axes conflicts (" + "; ".join(
                sorted({p.conflict() or "" for p in data_paths(self, keep_conflicts=True)})) + ")")  # fmt: skip
        if self.strategy != "list":
            for kind in kinds(self):
                if not variants(self, kind):
                    where = f" on {kind}" if kind else ""
                    raise ValueError(f"space: every form{where} is refused with the other axes (" + "; ".join(
                        sorted({why for _, why in variant_problems(self, kind)})) + ")")  # fmt: skip
        paths = [c.path for c in self.configurations] if self.strategy == "list" else data_paths(self)
        if self.template.server.gpus == 0:
            for path in paths:
                if needs := path.gpu_only():
                    raise ValueError(f"space: dataPath.{needs[0]} needs a GPU, and template.server.gpus is 0")
        size = space_size(self)
        if size > MAX_SPACE:
            shown = 6 if self.space.form is not None else 5  # the forms' count where they are varied
            counts = " + ".join(
                " x ".join(str(len(v)) for v in axis_values(self, kind)[:shown]) for kind in kinds(self)
            )
            raise ValueError(f"space: {size} configurations ({counts}) is more than the {MAX_SPACE} a sweep may have")
        return self

    @model_validator(mode="after")
    def _cost_needs_a_price(self, info: ValidationInfo) -> SweepSpec:
        # on a cluster whose chart prices its nodes, each trial is priced by the node it ran on
        prices_elsewhere = bool((info.context or {}).get(PRICES_ELSEWHERE))
        if self.objective.optimize == "cost" and self.template.cost is None and not prices_elsewhere:
            raise ValueError(
                "objective.optimize cost needs template.cost.pricePerHour (locally: or --price-per-hour; on a "
                "cluster: or the chart's pricing.perGpuProduct / pricing.perNode)"
            )
        return self

    @field_validator("configurations")
    @classmethod
    def _distinct(cls, value: list[TrialConfig]) -> list[TrialConfig]:
        seen: set[ConfigKey] = set()
        for config in value:
            if config.key() in seen:
                raise ValueError(f"configuration {config.label()} appears twice")
            seen.add(config.key())
        return value


def kinds(sweep: SweepSpec) -> list[ServerKind | None]:
    """The servers a sweep compares, in the order given; [None] without a kind axis (the template's)."""
    space = sweep.space
    return list(space.kind.values) if sweep.strategy != "list" and space.kind is not None else [None]


def axis_values(sweep: SweepSpec, kind: ServerKind | None = None) -> list[list[Any]]:
    """Per axis (batch, delay, workers, precision, data path, form), its values ascending on server `kind`
    (its own knob axes where perKind gives them); the template's where not varied (the data paths:
    :func:`data_paths`; the forms in the axis' order). For strategy list: one list, the configurations."""
    if sweep.strategy == "list":
        return [list(sweep.configurations)]
    server, shared = sweep.template.server, sweep.space
    own = shared.per_kind.get(kind or "") or KnobSpace()
    batch = own.batch_size or shared.batch_size
    delay = own.max_batch_delay_ms or shared.max_batch_delay_ms
    workers = own.workers or shared.workers
    precision = own.precision or shared.precision
    return [
        batch.expand() if batch else [server.batch_size],
        delay.expand() if delay else [server.max_batch_delay_ms],
        workers.expand() if workers else [server.workers],
        [Precision(p) for p in precision.values] if precision else [server.precision],
        data_paths(sweep),
        list(shared.form.values) if shared.form else [server.form],
    ]


def _variant_problem(sweep: SweepSpec, variant: Variant, kind: ServerKind | None) -> str | None:
    """Why server `kind` (None: the template's) cannot run this precision, data path and form together, or
    None: what it declares it serves (the form; the user's model's format), then the form with the rest."""
    precision, path, form = variant
    update: dict[str, Any] = {"precision": precision, "data_path": path, "form": form}
    server = sweep.template.server.model_copy(update=update | ({"kind": kind} if kind is not None else {}))
    problem = sweep.template.model_copy(update={"server": server}).format_problem() or server.form_problem()
    return problem or server.data_path_problem()


def _all_variants(sweep: SweepSpec, kind: ServerKind | None) -> list[Variant]:
    """Every form x precision x data path, the form outermost (a local sweep rebuilds the model per form)."""
    precisions, paths, forms = axis_values(sweep, kind)[3:]
    return [(precision, path, form) for form in forms for precision in precisions for path in paths]


def variants(sweep: SweepSpec, kind: ServerKind | None = None) -> list[Variant]:
    """The precision, data path and form combinations a sweep tries on server `kind`: those the server can
    run (a form the precision, the device or the compile mode rules out is left out: :func:`variant_problems`)."""
    return [variant for variant in _all_variants(sweep, kind) if _variant_problem(sweep, variant, kind) is None]


def variant_problems(sweep: SweepSpec, kind: ServerKind | None = None) -> list[tuple[Variant, str]]:
    """The combinations left out of server `kind`'s space, each with its reason (naming the fields)."""
    found = [(variant, _variant_problem(sweep, variant, kind)) for variant in _all_variants(sweep, kind)]
    return [(variant, why) for variant, why in found if why is not None]


def left_out(sweep: SweepSpec) -> list[tuple[TrialConfig, str]]:
    """The configurations a grid leaves out because their form cannot run with the rest, with the reason:
    listed among the sweep's pruned configurations (none for strategy list)."""
    if sweep.strategy == "list":
        return []
    found = []
    for server in kinds(sweep):
        batches, delays, workers = axis_values(sweep, server)[:3]
        for (precision, path, form), why in variant_problems(sweep, server):
            found += [
                (TrialConfig(kind=server, batch_size=b, max_batch_delay_ms=d, workers=w, precision=precision,
                             data_path=path, form=form), why)
                for w, d, b in itertools.product(workers, delays, batches)
            ]  # fmt: skip
    return found


def data_paths(sweep: SweepSpec, keep_conflicts: bool = False) -> list[DataPath]:
    """The data paths a sweep tries: every combination of its data-path axes over the template's data path
    (just the template's when none is varied), without the combinations that conflict."""
    base, space = sweep.template.server.data_path, sweep.space
    choices: dict[str, list[Any]] = {}
    for name in DATA_PATH_AXES:
        axis = getattr(space, name)
        if axis is None:
            choices[name] = [getattr(base, name)]
        else:
            choices[name] = axis.expand() if isinstance(axis, IntAxis) else list(axis.values)
    combos = [base.model_copy(update=dict(zip(choices, values, strict=True)))
              for values in itertools.product(*choices.values())]  # fmt: skip
    return combos if keep_conflicts else [path for path in combos if path.conflict() is None]


def space_size(sweep: SweepSpec) -> int:
    """How many configurations the sweep has: a list's length; else, on each server of the kind axis, the
    product of its axes."""
    if sweep.strategy == "list":
        return len(sweep.configurations)
    total = 0
    for kind in kinds(sweep):
        batches, delays, workers = axis_values(sweep, kind)[:3]
        total += len(batches) * len(delays) * len(workers) * len(variants(sweep, kind))
    return total


#: A trial is a ServingExperiment: its name must fit the experiment's 52 characters.
TRIAL_NAME_LIMIT = 52


def trial_name(sweep_name: str, config: TrialConfig, repeat: int = 0) -> str:
    """Deterministic and unique per configuration, at most 52 characters: `<sweep>-b8-d5-w1-fp32`
    (a long sweep name is cut and keeps a digest of the whole, so two sweeps never share trials); the
    `repeat`-th confirmation of a trial ends in `-r<repeat>` (an extreme label is cut too, keeping a digest)."""
    label = config.label() + (f"-r{repeat}" if repeat else "")
    if len(label) > TRIAL_NAME_LIMIT - 8:  # room for at least a letter of the sweep and its digest
        digest = hashlib.sha256(label.encode()).hexdigest()[:6]
        label = f"{label[: TRIAL_NAME_LIMIT - 8 - 7].rstrip('-')}-{digest}"
    room = TRIAL_NAME_LIMIT - len(label) - 1
    if len(sweep_name) > room:
        digest = hashlib.sha256(sweep_name.encode()).hexdigest()[:4]
        sweep_name = f"{sweep_name[: room - 5].rstrip('-')}-{digest}"
    return f"{sweep_name}-{label}"


def grid(sweep: SweepSpec, kind: ServerKind | None = None, every_kind: bool = True) -> list[TrialConfig]:
    """Every configuration, server outermost (in the kind axis' order), then the form, precision, the data
    path, and batch size innermost (or the explicit list); only server `kind`'s with `every_kind` False.
    A form the rest cannot run is left out (:func:`left_out`)."""
    if sweep.strategy == "list":
        return list(sweep.configurations)
    found = []
    for server in kinds(sweep) if every_kind else [kind]:
        batches, delays, workers = axis_values(sweep, server)[:3]
        found += [
            TrialConfig(kind=server, batch_size=b, max_batch_delay_ms=d, workers=w, precision=p, data_path=path,
                        form=form)
            for (p, path, form), w, d, b in itertools.product(variants(sweep, server), workers, delays, batches)
        ]  # fmt: skip
    return found


def trial_spec(sweep: SweepSpec, config: TrialConfig) -> ExperimentSpec:
    """The template with one configuration applied (validated like any experiment spec)."""
    server = sweep.template.server.model_dump(by_alias=True, exclude_none=True)
    server.update(
        batchSize=config.batch_size,
        maxBatchDelayMs=config.max_batch_delay_ms,
        workers=config.workers,
        precision=str(config.precision),
        dataPath=config.path.handler_settings(),
    )
    if config.kind is not None:
        server["kind"] = config.kind
    if config.form is not None:
        server["form"] = str(config.form)
    document = sweep.template.model_dump(by_alias=True, exclude_none=True, mode="json")
    document["server"] = server
    return ExperimentSpec.model_validate(document)


class ServingSweep(SpecModel):
    """A whole sweep document, as applied with kubectl or run with `servinglab sweep`."""

    api_version: Literal["servinglab.dev/v1alpha1"]
    kind: Literal["ServingSweep"]
    metadata: ObjectMeta
    spec: SweepSpec


def _axis_bounds(document: Mapping[str, Any]) -> list[str]:
    """Axis values the experiment would refuse, named at their place in the sweep document (the shared
    axes and each server's own)."""
    problems: list[str] = []
    space = ((document.get("spec") or {}).get("space")) or {}
    if not isinstance(space, Mapping):
        return problems
    spaces = [("spec.space", space)]
    per_kind = space.get("perKind")
    if isinstance(per_kind, Mapping):
        spaces += [(f"spec.space.perKind.{name}", own) for name, own in per_kind.items() if isinstance(own, Mapping)]
    for where, knobs in spaces:
        for axis in ("batchSize", "maxBatchDelayMs", "workers", "decodeThreads"):
            form = knobs.get(axis)
            if not isinstance(form, Mapping):
                continue
            values = form.get("values")
            places = [(f"values[{i}]", v) for i, v in enumerate(values)] if isinstance(values, list) else []
            places += [(end, form[end]) for end in ("min", "max") if end in form]
            for place, value in places:
                try:
                    ServerSpec.model_validate({"dataPath": {axis: value}} if axis == "decodeThreads" else {axis: value})
                except ValidationError as exc:
                    problems += [f"{where}.{axis}.{place}: {describe_error(e)}" for e in exc.errors()]
    return problems


def parse_sweep(document: Any, source: str | None = None, prices_elsewhere: bool = False) -> ServingSweep:
    """Validate one parsed sweep document; raise :class:`~servinglab.api.meta.SpecError` naming every bad
    field (an axis value the experiment would refuse included). `prices_elsewhere`: the trials are priced by
    where they run (an operator whose chart has prices), so a cost objective needs no template price."""
    problems = _axis_bounds(document) if isinstance(document, Mapping) else []
    context = {PRICES_ELSEWHERE: prices_elsewhere}
    return parse_document(ServingSweep, document, source, "sweep", problems, context)


def load_sweep(path: str | Path, price_per_hour: float | None = None) -> ServingSweep:
    """Read and validate a sweep file (YAML or JSON, exactly one document); a `price_per_hour` overrides its
    template's."""
    return parse_sweep(with_price(read_document(path, "sweep"), price_per_hour), str(path))
