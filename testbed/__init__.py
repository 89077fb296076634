"""Geo-distributed LLM training on one machine."""

__version__ = "0.1.0"
