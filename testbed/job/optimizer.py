"""The job's `optimizer` section: what real compute trains with (testbed.job.model's
InnerOptimizer), read and written."""

from __future__ import annotations

from typing import Any, TypedDict

from testbed.common.fields import Fields, number, positive
from testbed.job.model import InnerOptimizer

OPTIMIZER_KEYS = ("lr", "weight_decay")


class OptimizerSection(TypedDict):
    """The section as the job file writes it (dump_optimizer)."""

    lr: float
    weight_decay: float


def parse_optimizer(fields: Fields | None) -> InnerOptimizer:
    """The section's settings, the defaults for those it leaves out; a located InputError
    for a bad one (`lr` above 0, `weight_decay` 0 or more, both finite)."""
    default = InnerOptimizer()
    if fields is None:
        return default
    lr = fields.get("lr", positive(_real), default.lr)
    weight_decay = fields.get("weight_decay", positive(_real, allow_zero=True),
                              default.weight_decay)
    fields.done()
    return InnerOptimizer(lr, weight_decay)


def dump_optimizer(optimizer: InnerOptimizer) -> OptimizerSection:
    return {"lr": optimizer.lr, "weight_decay": optimizer.weight_decay}


def _real(value: Any) -> float:
    """A number, or text that spells one (YAML reads `4e-4` as text)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    return number(value)
