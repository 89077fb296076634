"""The job's `compute_time`: a measured compute time to cost the job's compute by, instead
of the GPU type's peak and efficiency (testbed.plan.compute turns it into a FLOP rate), as
the DiLoCo papers' simulations state a step time: `step`, one replica's whole training
step (every microbatch, forward and backward, through every layer), or `layer`, the
forward and backward of one transformer layer for one microbatch. Read and written."""

from __future__ import annotations

from typing import Any, TypedDict

from testbed.common.fields import Fields
from testbed.common.units import parse_duration
from testbed.job.model import ComputeTime

COMPUTE_TIME_KEYS = ("step", "layer")
LONGEST_S = 86_400.0
"""A day: no step or layer a run could model takes longer."""


def parse_compute_time(fields: Fields | None) -> ComputeTime | None:
    """The section's one measure, or None when absent; a located InputError naming the
    key for a second measure, none, or a duration that is not positive or beyond a day."""
    if fields is None:
        return None
    given = [key for key in COMPUTE_TIME_KEYS if fields.has(key)]
    if len(given) != 1:
        fields.check_keys()  # unknown keys first: a misspelling is named as such
        raise fields.error(None, "give one of step (a replica's whole step) or layer (one "
                           f"layer, one microbatch), not {' and '.join(given) or 'neither'}")
    per = given[0]
    seconds = fields.get(per, _duration)
    fields.done()
    return ComputeTime(per, seconds)  # type: ignore[arg-type]


class ComputeTimeSection(TypedDict, total=False):
    """The section as the job file writes it (dump_compute_time): one of the two keys."""

    step: float
    layer: float


def dump_compute_time(compute: ComputeTime) -> ComputeTimeSection:
    if compute.per == "step":
        return {"step": compute.seconds}
    return {"layer": compute.seconds}


def _duration(value: Any) -> float:
    seconds = parse_duration(value)
    if not 0 < seconds <= LONGEST_S:
        raise ValueError(f"must be above 0 and at most a day, got {value!r}")
    return seconds
