"""What users write and read: the experiment and sweep specs, typed results and status, the CRDs.

The bottom layer of the package: it imports nothing else of servinglab. The spec's names are
re-exported here (`from servinglab.api import ServingExperiment, LoadSpec`); results, status and the
CRD generator are imported from their modules.
"""

from servinglab.api.datapath import CompileMode, DataPath, Decode, Transfer
from servinglab.api.experiment import (
    CeilingSpec,
    CleanupSpec,
    ExperimentSpec,
    MetricsSpec,
    ServingExperiment,
    SloSpec,
    load_experiment,
    parse_experiment,
)
from servinglab.api.kube import Resources
from servinglab.api.load import (
    MAX_GENERATORS,
    BurstShape,
    GeneratorLimits,
    LoadSpec,
    PayloadFormat,
    PayloadSpec,
    RateSearchSpec,
    ResponseCheck,
    ShapeSpec,
    StabilitySpec,
    StepShape,
    TraceShape,
)
from servinglab.api.meta import (
    API_GROUP,
    API_VERSION,
    EXPERIMENT_LABEL,
    EXPERIMENT_UID_LABEL,
    GROUP_VERSION,
    KIND,
    PLURAL,
    SWEEP_KIND,
    SWEEP_LABEL,
    SWEEP_PLURAL,
    ObjectMeta,
    SpecError,
    SpecModel,
    VolumePath,
    read_document,
)
from servinglab.api.modelref import BUILTIN_MODELS, ModelFormat, ModelInput, ModelRef, ModelSource, SecretKeyRef
from servinglab.api.servers import (
    Precision,
    RequestEncoding,
    RequestProtocol,
    ServerKind,
    ServerSpec,
    Toleration,
)
from servinglab.api.sweep import (
    MAX_SPACE,
    ServingSweep,
    SweepSpec,
    axis_values,
    grid,
    kinds,
    load_sweep,
    parse_sweep,
    space_size,
    trial_name,
    trial_spec,
)
from servinglab.api.trialconfig import TrialConfig

__all__ = [
    "API_GROUP", "API_VERSION", "BUILTIN_MODELS", "EXPERIMENT_LABEL", "EXPERIMENT_UID_LABEL", "GROUP_VERSION", "KIND",
    "MAX_GENERATORS", "MAX_SPACE", "PLURAL", "SWEEP_KIND", "SWEEP_LABEL", "SWEEP_PLURAL",
    "BurstShape", "CeilingSpec", "CleanupSpec", "CompileMode", "DataPath", "Decode", "ExperimentSpec",
    "GeneratorLimits", "LoadSpec", "MetricsSpec",
    "ModelFormat", "ModelInput", "ModelRef", "ModelSource", "ObjectMeta", "PayloadFormat", "PayloadSpec",
    "Precision", "RateSearchSpec", "RequestEncoding", "RequestProtocol", "Resources", "ResponseCheck",
    "SecretKeyRef", "ServerKind", "ServerSpec",
    "ServingExperiment", "ServingSweep", "ShapeSpec", "SloSpec", "SpecError", "SpecModel", "StabilitySpec",
    "StepShape", "SweepSpec", "Toleration", "TraceShape", "Transfer", "TrialConfig", "VolumePath",
    "axis_values", "grid", "kinds", "load_experiment", "load_sweep", "parse_experiment", "parse_sweep", "read_document",
    "space_size", "trial_name", "trial_spec",
]  # fmt: skip
