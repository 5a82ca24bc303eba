"""When open-loop requests are sent (pure): evenly spaced, or a Poisson process.

A Poisson process of rate λ has independent exponential gaps with mean 1/λ: the arrival pattern of
many independent clients, and the one MLPerf's server scenario uses. The generator is seeded, so a
level's schedule is reproducible.
"""

from __future__ import annotations

import random


def arrival_offsets(rate_rps: float, seconds: float, arrival: str, seed: int) -> list[float]:
    """Send times (seconds from the level's start) of every request in [0, seconds)."""
    if rate_rps <= 0:
        raise ValueError(f"rate {rate_rps} must be positive")
    if arrival == "constant":
        return [i / rate_rps for i in range(int(seconds * rate_rps))]
    if arrival != "poisson":
        raise ValueError(f"arrival '{arrival}' is neither 'poisson' nor 'constant'")
    rng = random.Random(seed)
    offsets, now = [], rng.expovariate(rate_rps)
    while now < seconds:
        offsets.append(now)
        now += rng.expovariate(rate_rps)
    return offsets
