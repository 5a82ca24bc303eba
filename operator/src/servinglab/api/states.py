"""The states servinglab writes, one vocabulary each: an experiment's and a sweep's `status.summary.state`
(what `kubectl get` shows), a trial's state and a confirmation's. The CRDs' status schemas list them
(`enum`), generated from these; a member is its string, so the stored values are the plain strings.
"""

from __future__ import annotations

from enum import StrEnum


class ExperimentState(StrEnum):
    """A ServingExperiment's state: a digest of its conditions, for display."""

    #: Waiting for a GPU (the Queued condition says for which and the position): nothing to do but wait.
    QUEUED = "Queued"
    #: Its server is being deployed (the model fetched and prepared, the server starting).
    DEPLOYING = "Deploying"
    #: The server is ready; the load Job is about to start.
    READY = "Ready"
    #: The load Job is measuring.
    RUNNING = "Running"
    #: Measured: the results are in status.results (and `servinglab results`).
    SUCCEEDED = "Succeeded"
    #: Ended early: the Failed condition's reason and message say why and what to change.
    FAILED = "Failed"


class SweepState(StrEnum):
    """A ServingSweep's state."""

    #: Trials are running (status.summary counts them).
    RUNNING = "Running"
    #: The search stopped (the Succeeded condition says why); the best is in status.best.
    SUCCEEDED = "Succeeded"
    #: Ended early: the Failed condition's reason and message say why (trials already running go on).
    FAILED = "Failed"


class TrialState(StrEnum):
    """A finished trial's state: measured, or a configuration that cannot run (a result, not a failure)."""

    #: Measured (its capacity may still be absent when no level met the objective: reason NoLevelWithinSlo).
    SUCCEEDED = "Succeeded"
    #: Could not run (out of memory, never ready, crashed, ...: its reason says which); never ranked.
    INFEASIBLE = "Infeasible"


class ConfirmationState(StrEnum):
    """Where a sweep's confirmation (its top candidates measured again, alternating) stands."""

    #: Its rounds are running.
    RUNNING = "Running"
    #: One candidate is better than the others: the winner.
    CONFIRMED = "Confirmed"
    #: The winner could not be told from others (named in tiedWith): pick among them by other criteria.
    TIE = "Tie"
    #: No candidate met the objective in any of its runs: relax the SLO or try other configurations.
    NONE_WITHIN_SLO = "NoneWithinSlo"


class Confidence(StrEnum):
    """How sure a sweep is of the configuration it names best (`best.confidence`, `summary.winner`)."""

    #: Its confirmation's re-measurements put it above every other candidate.
    CONFIRMED = "Confirmed"
    #: Its confirmation could not tell it from others (`tiedWith`): any of them will do.
    TIE = "Tie"
    #: The highest single measurement, with no confirmation: set `confirm` to re-measure the top candidates.
    UNCONFIRMED = "Unconfirmed"
    #: The highest single measurement while the confirmation runs.
    CONFIRMING = "Confirming"
    #: Every confirmation run of every candidate missed the SLO: the best first measurement, no capacity plan.
    NONE_WITHIN_SLO = "NoneWithinSlo"
