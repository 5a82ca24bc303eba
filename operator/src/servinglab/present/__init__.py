"""What people read: the console tables, the progress display, and the HTML/PNG reports.

Everything here reads the typed results (:mod:`servinglab.api.results`, :mod:`servinglab.api.trials`),
whichever wing produced them; only the command line calls it.
"""
