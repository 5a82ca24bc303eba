"""The Kubernetes wing: the operator that runs ServingExperiments and ServingSweeps on a cluster, the
load Job's program, and the client side of `servinglab run --cluster`.

* :mod:`.main` — the kopf wiring alone (start-up, handlers, leader election through :mod:`.leader`);
* :mod:`.experiment` — the experiment reconciler: one idempotent pass per experiment (:mod:`.experiment.reconcile`),
  its GPU queue, placement, pods, status and the collection of its results;
* :mod:`.sweep` — the sweep reconciler: trials as child experiments, rolled up into the sweep's status;
* :mod:`.builders`, :mod:`.modelsecrets`, :mod:`.deadline` — pure builders of the objects the operator creates;
* :mod:`.client` — the only module that talks to the Kubernetes API; :mod:`.cache` keeps watch-fed lists;
* :mod:`.settings` — the operator's settings from the chart's environment; :mod:`.credentials` — which
  Secrets may travel where;
* :mod:`.loadjob`, :mod:`.sink` — the load Job's program and where it stores its results;
* :mod:`.promql` — GPU figures from Prometheus over measured windows; :mod:`.metrics` — the operator's own;
* :mod:`.follow`, :mod:`.health` — the command line's side: follow an experiment, check the operator.
"""
