"""The ServingSweep reconciler (:mod:`.reconcile`): trials as child ServingExperiments, proposed and rolled
up by :mod:`servinglab.sweep`.
"""
