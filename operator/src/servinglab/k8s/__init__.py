"""The Kubernetes side of servinglab: the ServingExperiment operator and what it builds.

* :mod:`.resources` — pure builders of every child object;
* :mod:`.conditions`, :mod:`.summary` — pure status helpers;
* :mod:`.client` — the only module that talks to the Kubernetes API;
* :mod:`.promql` — GPU and TorchServe figures from Prometheus over measured windows;
* :mod:`.operator` — kopf handlers that orchestrate the above (`servinglab operator`).
"""
