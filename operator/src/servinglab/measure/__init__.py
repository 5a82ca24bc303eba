"""What the numbers mean: typed levels from the load generator's samples and the server's breakdown,
the SLO and the best level (defined once), trust checks, and how far a result is from its ceilings.

Above the load generator and the servers, below the sweep and the two wings (local, Kubernetes).
"""
