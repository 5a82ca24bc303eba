"""Sweeps: many configurations of one experiment, searched for the best within the SLO."""
