"""Scenarios: what happens to a run over time - link traces, stragglers, machines lost and how
the run recovers."""
