"""Which parameters a fragment holds, so both backends sync the same part of a stage.

Streaming DiLoCo (arXiv 2501.18512, section 2.2) cuts the model into fragments of whole
transformer blocks in a strided pattern: block i belongs to fragment i mod N (the paper
finds strided better than sequential). The token (and position) embeddings go with block
0's fragment, the final norm and output layer with the last block's. A stage holds the
blocks it runs: a fragment may hold none of a stage's (the stage then sends nothing for
it). Pure: counts from the model shape, for the simulator's bytes; the real-compute
worker picks the same tensors by these rules (testbed.emulator.runtime.worker.compute.model).
"""

from __future__ import annotations

from testbed.job.model import ModelShape


def block_fragment(block: int, fragments: int) -> int:
    """The fragment global block `block` belongs to."""
    return block % fragments


def embedding_fragment(fragments: int) -> int:
    return block_fragment(0, fragments)


def head_fragment(layers: int, fragments: int) -> int:
    return block_fragment(layers - 1, fragments)


def stage_blocks(layers: tuple[int, ...], stage: int) -> range:
    """Global indices of the blocks stage `stage` runs."""
    first = sum(layers[:stage])
    return range(first, first + layers[stage])


def fragment_params(model: ModelShape, layers: tuple[int, ...], stage: int, fragment: int,
                    fragments: int) -> int:
    """Parameters of `fragment` (of `fragments`) that stage `stage` holds; over every
    fragment they add up to the stage's parameters (testbed.plan.compute.stage_params)."""
    blocks = sum(1 for b in stage_blocks(layers, stage) if block_fragment(b, fragments) == fragment)
    params = blocks * model.params_per_layer
    first, last = stage == 0, stage == len(layers) - 1
    if first and fragment == embedding_fragment(fragments):
        params += model.embedding_params
    if last and fragment == head_fragment(model.layers, fragments) and not (
            first and model.tied_embeddings):  # a stage that is both holds a tied one once
        params += model.embedding_params
    return params
