"""The policy SDK: everything a policy plugin needs, and the only testbed module it imports.

Names here stay put across releases of the same API_VERSION; everything else in testbed
may move. A plugin declares the version it was written for (`api_version`, inherited from
TrainingPolicy and BubblePolicy as the current one) and the registry refuses a mismatch.
"""

from __future__ import annotations

from testbed.errors import InputError
from testbed.job.model import Job, ModelShape
from testbed.loss.effects import (
    CompressedGradients,
    Exact,
    LocalSteps,
    LossEffect,
    Unmodelled,
    diloco,
    streaming_diloco,
)
from testbed.loss.model import Estimate, LossModel, Penalty
from testbed.plan.buckets import DDP_BUCKET_MB, in_buckets
from testbed.plan.build import (
    Connections,
    LinkKind,
    Schedule,
    build_plan,
    dc_pipelines,
    default_pp,
    file_order_placement,
    fits_memory,
    virtual_placement,
)
from testbed.plan.collective import Collective, Reduces, Scope
from testbed.plan.compute import StageCost, ring_allreduce_s, stage_cost
from testbed.plan.cycles import Iteration, Tail, cycled
from testbed.plan.model import (
    Action,
    HostTcp,
    Op,
    OuterOptimizer,
    Plan,
    Sharing,
    SyncOrder,
    Worker,
    split_layers,
)
from testbed.plan.schedules import Sends, schedule_actions
from testbed.plan.tcp_model import (
    PAYLOAD_EFFICIENCY,
    WINDOW_EFFICIENCY,
    HostLimits,
    in_flight_bytes,
)
from testbed.plan.torch_order import load_torch
from testbed.policy.base import (
    API_VERSION,
    Bubble,
    BubblePolicy,
    Chunk,
    NoSettings,
    Option,
    PrefillTimes,
    Request,
    RequestQueue,
    TrainingPolicy,
    Transfer,
    first_at_most,
    first_layers_first,
    setting,
)
from testbed.policy.context import PlanningContext
from testbed.policy.loss_effect import effect_of
from testbed.policy.option_parsers import (
    at_least_one,
    bucket_size,
    fraction,
    non_negative,
    non_negative_int,
    on_off,
    one_of,
    payload,
    positive,
)
from testbed.topology.model import Datacenter, Gpu, GpuType, TcpSettings, Topology, WanLink

__all__ = [
    "API_VERSION",
    "DDP_BUCKET_MB",
    "PAYLOAD_EFFICIENCY",
    "WINDOW_EFFICIENCY",
    "Action",
    "Bubble",
    "BubblePolicy",
    "Chunk",
    "Collective",
    "CompressedGradients",
    "Connections",
    "Datacenter",
    "Estimate",
    "Exact",
    "Gpu",
    "GpuType",
    "HostLimits",
    "HostTcp",
    "InputError",
    "Iteration",
    "Job",
    "LinkKind",
    "LocalSteps",
    "LossEffect",
    "LossModel",
    "ModelShape",
    "NoSettings",
    "Op",
    "Option",
    "OuterOptimizer",
    "Penalty",
    "Plan",
    "PlanningContext",
    "PrefillTimes",
    "Reduces",
    "Request",
    "RequestQueue",
    "Schedule",
    "Scope",
    "Sends",
    "Sharing",
    "StageCost",
    "SyncOrder",
    "Tail",
    "TcpSettings",
    "Topology",
    "TrainingPolicy",
    "Transfer",
    "Unmodelled",
    "WanLink",
    "Worker",
    "at_least_one",
    "bucket_size",
    "build_plan",
    "cycled",
    "dc_pipelines",
    "default_pp",
    "diloco",
    "effect_of",
    "file_order_placement",
    "first_at_most",
    "first_layers_first",
    "fits_memory",
    "fraction",
    "in_buckets",
    "in_flight_bytes",
    "load_torch",
    "non_negative",
    "non_negative_int",
    "on_off",
    "one_of",
    "payload",
    "positive",
    "ring_allreduce_s",
    "schedule_actions",
    "setting",
    "split_layers",
    "stage_cost",
    "streaming_diloco",
    "virtual_placement",
]
