"""servinglab: which server configuration serves a model best on this hardware, within its SLO, and why.

The `servinglab` command (:mod:`servinglab.cli`) runs an experiment or a sweep on one machine
(:mod:`servinglab.local`) or follows it on a cluster, where the operator (:mod:`servinglab.k8s`) runs
it. What users write and read is :mod:`servinglab.api`; the model servers sit behind one seam
(:mod:`servinglab.servers`); :mod:`servinglab.measure` turns the load generator's
(:mod:`servinglab.loadgen`) exact samples into the typed results. The layers are in `.importlinter`.
"""

__version__ = "0.1.0"
