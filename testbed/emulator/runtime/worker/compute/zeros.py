"""Payloads nobody reads (emulated compute): zero bytes of any size that take no memory.

An emulated stage sends activations, gradients and ring chunks of the real size whose
content never matters, and has nothing to do with what it receives but count it. The
bytes come from one read-only anonymous mapping that is never written: reading an
untouched page of it maps the kernel's shared zero page, which counts in no process's
resident set, so a sender's tensors and a receiver's stand-ins for what it was sent cost
no memory however large or many they are (a `bytes(n)` or `bytearray(n)` of a GB is a
GB resident once the allocator has cleared it).
"""

from __future__ import annotations

import mmap

MIN_MAPPING = 1 << 20
_mapping: mmap.mmap | None = None


def zeros(nbytes: int) -> memoryview:
    """`nbytes` zero bytes, read-only, that no process holds in memory."""
    global _mapping
    if nbytes <= 0:
        return memoryview(b"")
    if _mapping is None or len(_mapping) < nbytes:
        size = max(MIN_MAPPING, 1 << (nbytes - 1).bit_length())
        # views of a smaller mapping keep it alive; it goes with the last of them
        _mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                             prot=mmap.PROT_READ)
    return memoryview(_mapping)[:nbytes]
