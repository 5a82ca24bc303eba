"""The ServingExperiment reconciler: :mod:`.reconcile` moves an experiment one step per pass, through
:mod:`.status` (the only writer of its status), :mod:`.admission` and :mod:`.gpuqueue` (who gets a GPU next,
from :mod:`.placement`'s facts), :mod:`.children` (applying the children), :mod:`.serverwait` (until the
server serves), :mod:`.loadrun` (the load Job until its results), :mod:`.pods` and :mod:`.diagnose` (pods
that never start), :mod:`.snapshot` (the spec it started with) and :mod:`.collect` (the load Job's results
into the status).
"""
