"""Figures computed from a run's spans: summaries, loss curves, overruns, intervals over repeats."""
