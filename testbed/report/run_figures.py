"""What a comparison reads of one run's results.json, typed and read in one place, from a
file any version of testbed wrote (`testbed report` redraws old comparisons): the figures
its table, its time to loss and its plots are made of."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from testbed.metrics.loss import TimeToLoss
from testbed.metrics.loss_prediction import LossPrediction


@dataclass(frozen=True)
class RunFigures:
    """One run's figures (`of` reads them): a file from before results had a schema holds
    what testbed.report.saved's RESULTS names, and a key added since may be absent."""

    compute: str
    typical_s: float | None
    """The typical iteration: the median, or for a plan whose iterations differ the mean
    over its whole cycles (a median would be a step without the cycle's sync)."""
    tokens_per_s: float | None
    util_training: float | None
    util_total: float | None
    wan_util: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    inference: Mapping[str, Any]
    """The inference block (requests, served, rejected, expired), as written."""
    predicted_s: float | None
    """Emulated: the simulator's iteration time for the same plan."""
    dilation: int
    cpu_bound: bool
    """An emulated run whose pace this machine set."""
    time_to_loss: TimeToLoss | None
    loss_model: LossPrediction | None
    measured_loss: bool
    """The run has a loss curve of its own (real compute)."""

    @classmethod
    def of(cls, results: Mapping[str, Any]) -> RunFigures:
        times = results["iteration_time_s"]
        cycled = (results.get("cycle_time_s") or {}).get("period", 1) > 1
        inference = results.get("inference") or {}
        ttft = inference.get("ttft_s") or {}
        return cls(
            compute=str(results.get("compute")),
            typical_s=times.get("mean") if cycled else times["median"],
            tokens_per_s=results["tokens_per_s"],
            util_training=results["gpu_utilization"]["training"],
            util_total=results["gpu_utilization"]["total"],
            wan_util=results["wan"]["utilization"],
            ttft_p50=ttft.get("p50"), ttft_p99=ttft.get("p99"), inference=inference,
            predicted_s=results.get("predicted_iteration_s"),
            dilation=int(results.get("dilation") or 1),
            cpu_bound=bool((results.get("emulation") or {}).get("cpu_bound")),
            time_to_loss=results.get("time_to_loss"),
            # the loss model came after the schema: a file without one never had it, and
            # what stands there unchecked is not one
            loss_model=results.get("loss_model") if "schema_version" in results else None,
            measured_loss=bool(results.get("loss_curve")))
