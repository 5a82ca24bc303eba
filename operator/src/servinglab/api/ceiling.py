"""What a results document says of the model itself: the ceiling (the model alone at each batch size, and
the chip's peak) and the model's description (its source, size, FLOPs and bytes moved). Parts of
:class:`servinglab.api.results.ExperimentResults`; written by the measurement (:mod:`servinglab.measure`).
"""

from __future__ import annotations

from servinglab.api.meta import ResultModel


class RawRow(ResultModel):
    """The model alone at one batch size."""

    batch_size: int
    throughput_rps: float
    passes: int | None = None
    pass_seconds: float | None = None
    #: A compiled model's first pass at a new padded size: its graph's compile, set-up that is not timed.
    compile_seconds: float | None = None
    note: str | None = None


class RawSkip(ResultModel):
    batch_size: int
    reason: str


class FormAlone(ResultModel):
    """The model alone in one form at the served batch size (`ceiling.forms`): measured (its throughput, the
    build's seconds, whether the build was cached), or why not (refused, build-failed, failed-gate)."""

    form: str
    status: str
    throughput_rps: float | None = None
    build_seconds: float | None = None
    cached: bool | None = None
    reason: str | None = None


class BestForm(ResultModel):
    """The fastest form alone at the served batch, against the served form alone there: `gain` is what the
    better form would add to the model (the served form's own gap to it is `servedOverRaw`'s business)."""

    form: str
    rps: float
    served_form: str
    served_form_rps: float
    gain: float


class Ceiling(ResultModel):
    """How far the served throughput is from the model alone (raw) and from the chip's peak."""

    flops_per_inference: int
    raw_batch_size: int | None = None
    formed_batch_size_mean: float | None = None
    raw_at_formed_batch_rps: float | None = None
    raw_best_rps: float | None = None
    raw_best_batch_size: int | None = None
    raw_device: str | None = None
    raw_budget_seconds: float | None = None
    raw_measure_seconds: float | None = None
    raw_setup_seconds: float | None = None
    raw_table: list[RawRow] | None = None
    raw_skipped: list[RawSkip] | None = None
    raw_reused_batch_sizes: list[int] | None = None
    accelerator: str | None = None
    peak_tflops: float | None = None
    theoretical_rps: float | None = None
    served_rps: float | None = None
    served_over_raw: float | None = None
    served_over_best_raw: float | None = None
    served_over_theoretical: float | None = None
    #: The form the raw figures ran in: the served one (absent: the model as it comes).
    form: str | None = None
    #: With `ceiling.forms`: every form alone at the formed batch, and the fastest against the served one.
    forms_alone: list[FormAlone] | None = None
    best_form: BestForm | None = None
    note: str | None = None


class DeclaredInput(ResultModel):
    """What one request decodes to, for a model packed with servinglab's handler."""

    format: str | None = None
    kind: str | None = None
    size: int | None = None
    shape: list[int] | None = None
    dtype: str | None = None


class ModelDescription(ResultModel):
    """What was served and where it came from (a built-in, or the user's source)."""

    name: str | None = None
    source: str | None = None
    format: str | None = None
    sha256: str | None = None
    size_bytes: int | None = None
    downloaded: bool | None = None
    handler: str | None = None
    input: DeclaredInput | None = None
    parameters: int | None = None
    flops_per_inference: float | None = None
    #: Bytes of the weights (read once per batch) and of the activations one inference moves, at fp32.
    weight_bytes: int | None = None
    activation_bytes: int | None = None
    count_note: str | None = None
    archive_config_replaced: str | None = None
