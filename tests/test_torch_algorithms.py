"""The orders of torch's pipeline schedules computed without torch
(testbed.plan.torch_algorithms) against torch's own classes: every rank's steps, idle
steps included, and every refusal with torch's words, over a grid of shapes."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch.distributed.pipelining.schedules as schedules
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

from testbed.plan.torch_algorithms import pipeline_order, stage_to_rank, step_text
from testbed.plan.torch_order import TORCH_CLASSES, V_SHAPED, stage_ranks, torch_order


class _Stub:
    """What the schedule classes read off a stage to compute their order."""

    def __init__(self, index: int, stages: int, ranks: int) -> None:
        self.stage_index, self.num_stages, self.group_size = index, stages, ranks
        self.group_rank = 0
        self.submod = None
        self.stage_index_to_group_rank: dict[int, int] = {}


def _torchs(schedule: str, ranks: int, virtual: int, microbatches: int) -> Any:
    """torch's pipeline_order, or its refusal's first line."""
    style = "v" if schedule in V_SHAPED else "loop"
    mapping = generate_stage_to_rank_mapping(ranks, ranks * virtual, style=style)
    stubs = [_Stub(s, ranks * virtual, ranks) for s, r in sorted(mapping.items()) if r == 0]
    logging.getLogger(schedules.__name__).setLevel(logging.ERROR)
    try:
        runner = getattr(schedules, TORCH_CLASSES[schedule])(stubs, microbatches)
    except (ValueError, AssertionError, RuntimeError) as exc:
        return str(exc).splitlines()[0]
    return {rank: [None if a is None else str(a) for a in actions]
            for rank, actions in runner.pipeline_order.items()}


def _ours(schedule: str, ranks: int, virtual: int, microbatches: int) -> Any:
    try:
        order = pipeline_order(schedule, ranks, virtual, microbatches)
    except ValueError as exc:
        return str(exc)
    return {rank: [step_text(s) for s in steps] for rank, steps in order.items()}


SHAPES = [(schedule, ranks, virtual)
          for schedule in TORCH_CLASSES for ranks in range(1, 7)
          for virtual in ((2,) if schedule in V_SHAPED else (1, 2, 3))]


@pytest.mark.parametrize(("schedule", "ranks", "virtual"), SHAPES)
def test_every_rank_steps_as_torchs_class_does(schedule: str, ranks: int, virtual: int) -> None:
    for microbatches in range(1, 19):
        assert _ours(schedule, ranks, virtual, microbatches) == \
            _torchs(schedule, ranks, virtual, microbatches), microbatches


@pytest.mark.parametrize("ranks", range(1, 7))
@pytest.mark.parametrize("virtual", range(1, 4))
def test_stage_mappings_are_torchs(ranks: int, virtual: int) -> None:
    for style in ("loop", "v"):
        assert stage_to_rank(ranks, ranks * virtual, style) == \
            generate_stage_to_rank_mapping(ranks, ranks * virtual, style=style)


def test_refusals_are_torchs_words() -> None:
    for shape in [("interleaved-1f1b", 4, 2, 9), ("interleaved-zb", 2, 2, 5),
                  ("dualpipe-v", 4, 2, 7), ("zb-v", 2, 3, 4)]:
        mine = _ours(*shape)
        assert isinstance(mine, str) and mine == _torchs(*shape)


def test_torch_order_reads_the_ranks_each_stage_runs_on() -> None:
    order = torch_order("zb-v", 4, 2, 8)
    assert order.stage_rank == stage_ranks("zb-v", 4, 2)
    assert order.stages_of(0) == (0, 7)
