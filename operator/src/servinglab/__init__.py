"""servinglab: find the TorchServe configuration that gets the most out of a model on a GPU.

Public entry points are the `servinglab` command (:mod:`servinglab.cli`) and the experiment spec
(:mod:`servinglab.spec`). The local runner (:mod:`servinglab.runner`) starts a real TorchServe
(:mod:`servinglab.local_server`) configured by :mod:`servinglab.tsconfig` and drives it with the
Locust-based load generator (:mod:`servinglab.loadgen`).
"""

__version__ = "0.1.0"
