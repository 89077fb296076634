"""Geo-distributed LLM training on one machine."""

__version__ = "0.1.0"

DISTRIBUTION = "geo-testbed"
"""The project's name on the package index (`pip install geo-testbed`), where `testbed` is
an unrelated project; the import package and the command are `testbed`."""
