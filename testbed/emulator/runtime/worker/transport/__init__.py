"""Tensors between worker processes over striped TCP connections, each send paced and
timed on the run's clock. Imports nothing else of the worker."""
