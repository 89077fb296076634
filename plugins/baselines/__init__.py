"""Baselines: GPipe and 1F1B with naive placement, and data parallelism across datacenters."""
