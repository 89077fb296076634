"""Plans: placement, per-GPU action lists, connections and WAN sharing; text forms; validation."""

from testbed.plan.model import Action, Op, Plan, Sharing, Worker, pair_key, split_layers
from testbed.plan.text import load_plan_csv, parse_plan_csv, plan_grid, plan_to_csv
from testbed.plan.validate import validate_plan

__all__ = [
    "Action",
    "Op",
    "Plan",
    "Sharing",
    "Worker",
    "load_plan_csv",
    "pair_key",
    "parse_plan_csv",
    "plan_grid",
    "plan_to_csv",
    "split_layers",
    "validate_plan",
]
