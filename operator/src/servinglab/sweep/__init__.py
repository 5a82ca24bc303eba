"""Sweeps: many configurations of one experiment, searched for the best within the SLO (pure, shared by
both wings).

* :mod:`.search` proposes the next trials (grid, list, or a guided search); :mod:`.rollup` turns their
  results into capacities, the best configuration and the Pareto front; :mod:`.objective` scores a
  candidate (throughput or cost within the SLO);
* :mod:`.confirm` measures the top candidates again and names the winner from what the runs agree on;
* :mod:`.export` writes the winner ready to deploy, and :mod:`.plan` its capacity plan and autoscaler targets.
"""
