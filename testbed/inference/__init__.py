"""Inference beside training: the request workload, its memory, and the bookkeeping of bubbles
filled with prefills."""
