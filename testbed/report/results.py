"""Every run's directory: results.json, trace.json, the plan, the inputs and the versions
needed to run it again. Backend-neutral: `up` and `simulate` write the same files."""

from __future__ import annotations

import csv
import io
import json
import math
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from testbed.bubbles import RequestRow
from testbed.compute import memory_summary
from testbed.fsutil import write_atomic
from testbed.job import Job
from testbed.metrics.loss import loss_curve, no_loss_reason, time_to_loss
from testbed.metrics.summary import Summary
from testbed.plan.model import Plan
from testbed.plan.text import plan_to_csv
from testbed.report.chrome import chrome_trace
from testbed.run_dirs import fresh_directory
from testbed.spans import Span
from testbed.topology import Topology, dump_topology
from testbed.yamlio import to_yaml

SCHEMA = 1
RUNS_DIR = Path("runs")


def new_run_dir(topology: str, policy: str, base: Path = RUNS_DIR) -> Path:
    """A new directory `base/<time>-<topology>-<policy>[-N]`, created here: runs started
    in the same second each get their own."""
    return fresh_directory(base, f"{time.strftime('%Y%m%d-%H%M%S')}-{topology}-{policy}")


def versions() -> dict[str, str]:
    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return {
        "testbed": of("testbed"),
        "torch": of("torch"),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


@dataclass
class RunRecord:
    """What one run did, whichever backend ran it."""

    backend: str
    policy: str
    bubble_policy: str | None
    topology: Topology
    job: Job
    plan: Plan
    shaper: str | None
    compute: str
    summary: Summary
    spans: list[Span]
    start: float
    status: str = "ok"
    error: str | None = None
    losses: dict[int, float] | None = None
    policy_options: dict[str, str] | None = None
    wall_s: float | None = None
    extra: dict[str, Any] | None = None
    target_loss: float | None = None
    """Report the time to reach this loss (`time_to_loss`)."""
    plan_file: str | None = None
    """The file of a plan the run was given (`--plan FILE`) rather than its policy's."""
    requests: list[RequestRow] | None = None
    """Each inference request's fate, for a run that filled bubbles (requests.csv)."""

    def results(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "backend": self.backend,
            "policy": self.policy,
            "bubble_policy": self.bubble_policy,
            "topology": self.topology.name,
            "shaper": self.shaper,
            "compute": self.compute,
            "iterations": len(self.summary.iteration_times),
            "iterations_requested": self.job.iterations,
            **self.summary.as_results(),
            "training_slowdown": None,
            "inference": {
                "requests": 0,
                "served": 0,
                "expired": 0,
                "rejected": 0,
                "ttft_s": {"p50": None, "p99": None},
            },
            "plan": self.plan.summary(),
            "plan_file": self.plan_file,
            "memory": memory_summary(self.job, self.plan),
            "seed": self.job.seed,
            "status": self.status,
            "error": self.error,
            "loss": {str(k): v for k, v in sorted((self.losses or {}).items())},
            **self.loss_results(),
            "policy_options": self.policy_options or {},
            "tcp": {
                dc.name: self.topology.tcp_for(dc.name).sysctls()
                for dc in self.topology.datacenters
            },
            "versions": versions(),
            "wall_s": self.wall_s,
        }
        out.update(self.extra or {})
        return out

    def loss_results(self) -> dict[str, Any]:
        """Loss against represented time, and the time to the target loss when one is set;
        a run that measured no loss says why instead of showing a curve."""
        no_loss = no_loss_reason(self.compute)
        curve = None if no_loss else loss_curve(
            self.losses or {}, self.summary.iteration_ends_s,
            self.summary.tokens_per_iteration)
        return {
            "loss_curve": curve,
            "loss_note": no_loss,
            "time_to_loss": None if self.target_loss is None
            else time_to_loss(curve or [], self.target_loss, no_loss),
        }


def write_run(directory: Path, record: RunRecord) -> Path:
    """Write every file of a run; results.json last, so its presence means complete."""
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / "topology.yaml", to_yaml(dump_topology(record.topology)), 0o644)
    write_atomic(directory / "plan.csv", plan_to_csv(record.plan), 0o644)
    trace = chrome_trace(record.spans, record.start, record.topology)
    write_atomic(directory / "trace.json", strict_json(trace), 0o644)
    write_atomic(directory / "spans.json",
                 strict_json({"start": record.start, "spans": record.spans}), 0o644)
    if record.requests is not None:
        write_atomic(directory / "requests.csv", requests_csv(record.requests), 0o644)
    write_atomic(directory / "results.json",
                 strict_json(record.results(), indent=1, default=str), 0o644)
    return directory / "results.json"


def requests_csv(rows: Sequence[RequestRow]) -> str:
    """One line per request: arrival, prefill start, GPU, time to first token (seconds
    since the run started) and what became of it."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(RequestRow.__annotations__),
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    return out.getvalue()


def strict_json(value: Any, **options: Any) -> str:
    """JSON any reader takes: a number JSON cannot hold (NaN or an infinity, as the loss
    of a diverged model) is written as null, never as the non-standard `NaN`."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:  # only then is the copy worth making
        return json.dumps(finite(value), allow_nan=False, **options)


def finite(value: Any) -> Any:
    """`value` with every NaN and infinity inside it replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value
