"""The reasons of servinglab's status conditions, one vocabulary: every condition the reconcilers write
(:mod:`servinglab.api.conditions`) names one of these, and so does every "<Reason>: <message>" an init
container or a server's launcher ends with.

The reasons an experiment or a sweep can fail with carry what happened and what the user then sees; the
README's table of failures is generated from them (:func:`failure_table`, `python -m
servinglab.api.reasons`), and a unit test keeps the two equal. The values are the wire format: a member is
its string, so the stored conditions are exactly what they were as plain strings.
"""

from __future__ import annotations

import sys
from enum import StrEnum


class Reason(StrEnum):
    """A condition's reason. A failure's member has `happened` (what ended the experiment) and `kept`
    (what the user sees, and what is kept to look into it); the others say when they are set."""

    happened: str
    kept: str

    def __new__(cls, value: str, happened: str = "", kept: str = "") -> Reason:
        member = str.__new__(cls, value)
        member._value_ = value
        member.happened, member.kept = happened, kept
        return member

    # Failed=True (and Succeeded=False): the experiment or sweep ended. The README's table, in this order.
    INVALID_SPEC = (
        "InvalidSpec",
        "the spec fails the operator's checks (the API server's schema already refuses wrong types)",
        "every bad field named; nothing is created",
    )
    UNSCHEDULABLE = (
        "Unschedulable",
        "no node matching the selector could ever offer the GPUs asked for (at once, naming the largest offer), or "
        "the scheduler cannot place the server for `SERVINGLAB_UNSCHEDULABLE_GRACE_SECONDS`",
        "the scheduler's message; nothing keeps a GPU",
    )
    MODEL_DOWNLOAD_FAILED = (
        "ModelDownloadFailed",
        "the model's URL answered an error (401, 404, ...), could not be reached, or the claim's path does not exist",
        "the URL or path and the error; the server is removed",
    )
    MODEL_TOO_LARGE = (
        "ModelTooLarge",
        "the model's file (or what a TorchServe archive unpacks to) is larger than `model.source.maxBytes` "
        "(default 16 GiB); the copy stops there, before the node's disk fills",
        "the size reached and how to raise the bound",
    )
    CREDENTIALS_NOT_ALLOWED = (
        "CredentialsNotAllowed",
        "`model.source.authorizationSecret` names a Secret key the chart's `modelCredentials` does not list for this "
        "namespace, or the URL's host is not one listed with it (and credentials go over https only)",
        "which key or host; nothing is created and no Secret is read",
    )
    MODEL_CHECKSUM_MISMATCH = (
        "ModelChecksumMismatch",
        "the file's sha256 is not `model.source.sha256`",
        "both digests; nothing is served",
    )
    MODEL_NOT_RECOGNIZED = (
        "ModelNotRecognized",
        "the file is not a TorchServe archive, TorchScript file, exported program or ONNX model (a plain state "
        "dict is named as such), or contradicts `format`",
        "what it is not and how to save it",
    )
    PRECISION_NOT_SUPPORTED = (
        "PrecisionNotSupported",
        "an archive with its own handler was asked for tf32/fp16/bf16, which servinglab cannot switch; an ONNX model "
        "was asked for fp16/bf16",
        "the handler's name; `server.precision`",
    )
    MODEL_PREPARATION_FAILED = (
        "ModelPreparationFailed",
        "the model init container failed for another reason",
        "its exit code and termination message",
    )
    SERVER_NOT_READY = (
        "ServerNotReady",
        "the server did not become ready within `startupTimeoutSeconds`",
        "the server is removed",
    )
    SERVER_CRASHED = (
        "ServerCrashed",
        "a server container restarted or terminated, before or during the load",
        "its exit code and termination message; the load is stopped",
    )
    SERVER_RESTARTED = (
        "ServerRestarted",
        "the server pod was deleted during the load (a replacement's cold start and caches would be measured as if "
        "nothing had happened)",
        "old and new pod named; no result is written from a level that spanned two servers",
    )
    LOAD_JOB_FAILED = (
        "LoadJobFailed",
        "the load Job failed: its pod died or was deleted mid-level (`backoffLimit: 0`), it ran past its deadline "
        "(computed from the planned load: docs/experiment-endings.md), or it could not write its results within "
        "`SERVINGLAB_RESULTS_WRITE_SECONDS`",
        "exit code and termination message; **no** partial result; the Job and its log (which holds the full results "
        "JSON) are kept",
    )
    RESULTS_MISSING = (
        "ResultsMissing",
        "the Job completed but its results are not there (a missing part)",
        "what is missing; the Job and its log are kept",
    )
    RESULTS_UNREADABLE = (
        "ResultsUnreadable",
        "the results ConfigMaps hold something no load Job of ours writes: a part or a document over its bound (900 "
        "KiB stored, 8 MiB unpacked, 32 parts, 600 000 values), a sha256 mismatch, not gzip or not JSON",
        "what was too large or malformed, read with bounded memory; the Job and its log are kept",
    )
    FORBIDDEN = (
        "Forbidden",
        "the operator may not create the Secret that holds the load generators' key (an install whose RBAC predates "
        "several load pods)",
        "the API's refusal; nothing is applied",
    )
    REJECTED = (
        "Rejected",
        "the API server refused to create a child (an admission policy or webhook, a ResourceQuota or LimitRange, a "
        "PodSecurity level): the same request would be refused again",
        "the API's message; what was created is removed",
    )
    IMAGE_PULL_FAILED = (
        "ImagePullFailed",
        "a server or load container cannot pull its image (at once for a bad name, after `startGraceSeconds` (30) of "
        "back-off)",
        "the image and the kubelet's message",
    )
    CONFIG_MISSING = (
        "ConfigMissing",
        "a container cannot start because a Secret or key it reads is missing, for `startGraceSeconds`",
        "the kubelet's message",
    )
    PAYLOAD_MISSING = (
        "PayloadMissing",
        "`load.payload.configMap` (or a file in it) is not there within `startGraceSeconds` of the experiment, or "
        "the load pod cannot start for its payload",
        "its name; nothing is deployed",
    )
    SERVER_LOST = (
        "ServerLost",
        "the server pod's node was deleted, or has not been `Ready` for `nodeGraceSeconds` (60; a kubelet restart or "
        "a missed heartbeat is waited out)",
        "the node",
    )
    SERVER_EVICTED = (
        "ServerEvicted",
        "the server pod was evicted by its node",
        "the kubelet's message",
    )
    OUT_OF_MEMORY = (
        "OutOfMemory",
        "a server container was OOM-killed, or the model does not fit the GPU (CUDA out of memory at load)",
        "the container and its limit; a sweep prunes every larger configuration",
    )
    MODEL_NOT_SUPPORTED = (
        "ModelNotSupported",
        "the server kind cannot serve this model's format (a TorchServe archive or model folder, with its own handler, "
        "on LitServe or Triton); an ONNX model with external data, an operator domain ONNX Runtime cannot load, or "
        "an input the handler cannot feed",
        "the source, the server and the formats it serves; the external file, the domain, or the input against "
        "`model.input` / `server.batchSize`",
    )
    MODEL_LOAD_FAILED = (
        "ModelLoadFailed",
        "the server's workers cannot load the model (the handler raised, or could not even be imported)",
        "the handler's exception, after two attempts",
    )
    RECONCILE_FAILED = (
        "ReconcileFailed",
        "the operator's passes over this experiment kept failing (an error the API keeps answering, a bug) for "
        "`failingSeconds` (300)",
        "the last error; the server is removed",
    )
    NAME_CONFLICT = (
        "NameConflict",
        "an object with a child's name exists and belongs to nothing of ours",
        "its name; nothing is overwritten",
    )
    FORM_DISAGREES = (
        "FormDisagrees",
        "the model's form (`server.form`) disagrees with eager fp32 on the probe batch beyond the precision's "
        "tolerance",
        "the largest absolute and relative error; nothing is served",
    )
    FORM_NOT_BUILT = (
        "FormNotBuilt",
        "the model's form could not be built (an export or a compile that fails)",
        "the builder's error; nothing is served",
    )
    FORM_NOT_SUPPORTED = (
        "FormNotSupported",
        "the form cannot run here (a library not installed, a GPU-only form with no GPU) or on this model",
        "what is missing, naming `spec.server.form`",
    )

    # Set while an experiment runs or as it succeeds: no action needed.
    #: Queued=False: a GPU is free for it (queuedSeconds says how long it waited).
    ADMITTED = "Admitted"
    #: ServerReady=Unknown: its server is being deployed (the model fetched and prepared, the server starting).
    DEPLOYING = "Deploying"
    #: ServerReady=True: every replica of the server is ready (the message names the pods).
    AVAILABLE = "Available"
    #: LoadTestComplete=False: the load Job is measuring.
    RUNNING = "Running"
    #: Queued=True: every GPU the experiment can use is taken (or a ResourceQuota is full); it waits its turn.
    WAITING_FOR_GPU = "WaitingForGPU"
    #: ServerReady=Unknown: a deleted experiment of the same name still has children; they are waited for.
    WAITING_FOR_PREDECESSOR = "WaitingForPredecessor"
    #: LoadTestComplete=True: the load Job completed and its results were read.
    COMPLETE = "Complete"
    #: Succeeded=True (Failed=False): the results are in status.results.
    MEASURED = "Measured"
    #: A sweep's Succeeded=True, Running=False: its search stopped (the message says why).
    FINISHED = "Finished"
    #: A sweep's Running=True: trials are running (the message counts them).
    TRIALS_RUNNING = "TrialsRunning"

    # GPUMetricsAvailable=False: the experiment succeeds without GPU figures; the message says what to fix.
    #: No Prometheus URL in spec.metrics or the operator's settings: set one to get GPU figures.
    NOT_CONFIGURED = "NotConfigured"
    #: Prometheus has no DCGM series for the server pod: check that the DCGM exporter scrapes its node.
    NO_DATA = "NoData"
    #: Prometheus did not answer (refused, TLS failure, timeout): check the URL and the network path.
    PROMETHEUS_UNREACHABLE = "PrometheusUnreachable"
    #: Prometheus answered with a redirect, which is never followed: give the final URL.
    PROMETHEUS_REDIRECTED = "PrometheusRedirected"
    #: The answer was not a Prometheus sample (or larger than its bound): check that the URL is Prometheus'.
    PROMETHEUS_QUERY_FAILED = "PrometheusQueryFailed"

    @property
    def fails(self) -> bool:
        """A reason an experiment or a sweep fails with (a row of the README's table)."""
        return bool(self.kept)

    @classmethod
    def named(cls, text: str) -> Reason | None:
        """The member spelled `text` (the start of a termination message), None for any other text."""
        return cls._value2member_map_.get(text)  # type: ignore[return-value]


#: The header of the README's table of failures, which :func:`failure_table` writes under.
FAILURE_TABLE_HEADER = "| reason | what happened | what you see / what is kept |"


def failure_table() -> str:
    """The README's table of the reasons an experiment fails with, from the members (their order)."""
    rows = [FAILURE_TABLE_HEADER, "| --- | --- | --- |"]
    rows += [f"| `{reason}` | {reason.happened} | {reason.kept} |" for reason in Reason if reason.fails]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(failure_table())
