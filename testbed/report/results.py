"""Every run's directory: results.json, spans.json, trace.json.gz, the plan, the inputs and
the versions needed to run it again. Backend-neutral: `up` and `simulate` write the same
files. spans.json holds the spans as rows: one per span of a GPU (`gpu`), or of a group of
GPUs that did the same thing at once (`gpus`: the simulator's tensor-parallel groups)."""

from __future__ import annotations

import csv
import io
import platform
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from testbed import DISTRIBUTION
from testbed.common.choices import TraceChoice
from testbed.common.codec import JsonObject, from_json, to_json
from testbed.common.fsutil import atomic_output, write_atomic
from testbed.common.span_table import rows
from testbed.common.spans import Span, SpanRow
from testbed.common.yamlio import to_yaml
from testbed.inference.bubbles import RequestRow
from testbed.job.model import Job
from testbed.loss.effects import LossEffect
from testbed.loss.model import LossModel
from testbed.metrics.loss import (
    LossOf,
    LossPoint,
    TimeToLoss,
    loss_curve,
    no_loss_reason,
    predicted_time_to_loss,
    synced_loss_curve,
    time_to_loss,
)
from testbed.metrics.loss_prediction import LossPrediction, loss_prediction
from testbed.metrics.summary import Summary
from testbed.plan.compute import memory_summary
from testbed.plan.model import Plan
from testbed.plan.queue_mismatch import queue_mismatches
from testbed.plan.text import plan_to_csv
from testbed.report.chrome import TRACE_FILE, trace_events, trace_scope, write_trace
from testbed.report.run_dirs import fresh_directory
from testbed.report.run_results import (
    SCHEMA_VERSION,
    BackendBlock,
    Inference,
    RecoveryBlock,
    Results,
)
from testbed.report.stream import dumps, write_json_items
from testbed.scenario.reach import Applied
from testbed.topology import Topology, dump_topology

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
        "testbed": of(DISTRIBUTION),
        "torch": of("torch"),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


class LossResults(TypedDict):
    """The loss keys of results.json (RunRecord.loss_results)."""

    loss_curve: list[LossPoint] | None
    loss_note: str | None
    time_to_loss: TimeToLoss | None
    loss_model: LossPrediction | None
    synced_loss_curve: NotRequired[list[LossPoint]]


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
    spans: Sequence[Span]
    start: float
    status: str = "ok"
    error: str | None = None
    losses: dict[int, float] | None = None
    policy_options: dict[str, str] | None = None
    wall_s: float | None = None
    backend_block: BackendBlock | None = None
    """What the backend alone writes (testbed.report.run_results)."""
    inference: Inference | None = None
    """The inference requests served in training's bubbles; None: none arrived."""
    recovery: RecoveryBlock | None = None
    """A run with a scenario's failures: each one, and the time they cost."""
    applied: Applied | None = None
    """Which of the run's events and scenario entries its training reached."""
    target_loss: float | None = None
    """Report the time to reach this loss (`time_to_loss`)."""
    plan_file: str | None = None
    """The file of a plan the run was given (`--plan FILE`) rather than its policy's."""
    requests: list[RequestRow] | None = None
    """Each inference request's fate, for a run that filled bubbles (requests.csv)."""
    trace: TraceChoice = "summary"
    """How much of the run trace.json.gz draws (testbed.report.chrome)."""
    synced_losses: dict[int, float] | None = None
    """A DiLoCo-family run's synchronized model's loss by iteration (real compute): what
    its time to loss ranks."""
    loss_model: LossModel | None = None
    """What predicts the run's loss (testbed.loss); None: no prediction."""
    loss_effect: LossEffect | None = None
    """What the run's method does to loss per token, as its policy declares it."""

    def results(self) -> JsonObject:
        """results.json's content as written (testbed.report.run_results' types as JSON):
        for code that reads the document; `typed` is the same as types."""
        return self.typed().document()

    def typed(self) -> Results:
        """What results.json holds, as types; a key the types do not have is a bug here,
        refused before anything is written."""
        typed: Results = from_json(self._fields(), Results, "results")
        return typed

    def _fields(self) -> JsonObject:
        """The document before `typed` checks it into Results."""
        out: JsonObject = {
            "schema_version": SCHEMA_VERSION,
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
            "trace": {"detail": self.trace, "left_out": self.trace_left_out()},
        }
        mismatched = queue_mismatches(self.topology, self.plan)
        if mismatched:
            out["queue_mismatches"] = to_json(mismatched)
        if self.inference is not None:
            out["inference"] = to_json(self.inference)
        for block in (self.backend_block, self.recovery, self.applied):
            if block is not None:
                out.update(to_json(block))
        return out

    def trace_left_out(self) -> str | None:
        """What the trace leaves out, in one line, or None."""
        return None if self.trace == "none" else trace_scope(self.plan, self.trace)[1]

    def loss_results(self) -> LossResults:
        """Loss against represented time, and the time to the target loss when one is set:
        measured where the run computed a loss, else the loss model's prediction; a run
        that measured no loss says why instead of showing a curve."""
        no_loss = no_loss_reason(self.compute)
        ends = self.summary.iteration_ends_s
        tokens = self.summary.iteration_tokens or self.summary.tokens_per_iteration
        curve = None if no_loss else loss_curve(self.losses or {}, ends, tokens)
        # a DiLoCo-family plan's replicas step apart: the model it keeps is the outer one
        loss_of: LossOf = "synchronized" if self.plan.keeps_outer_model else "training"
        synced = None if no_loss or loss_of == "training" else synced_loss_curve(
            self.synced_losses or {}, ends, tokens)
        predicted = self.prediction()
        target = self.target_loss
        if target is None:
            reached = None
        elif no_loss is None or predicted is None:
            reached = time_to_loss((curve if synced is None else synced) or [], target,
                                   no_loss, loss_of)
        else:
            ahead = predicted["target"]
            reached = predicted_time_to_loss(
                target, ahead["tokens"] if ahead else None, self.summary.tokens_per_s,
                ahead["reason"] if ahead else f"the loss model has no form for this plan: "
                f"{predicted['error']}", loss_of)
        out: LossResults = {"loss_curve": curve, "loss_note": no_loss,
                            "time_to_loss": reached, "loss_model": predicted}
        if synced:
            out["synced_loss_curve"] = synced
        return out

    def prediction(self) -> LossPrediction | None:
        """The loss model's prediction for this run, where it has a model and an effect."""
        if self.loss_model is None or self.loss_effect is None:
            return None
        return loss_prediction(self.loss_model, self.loss_effect, self.job,
                               self.summary.tokens_total, self.summary.tokens_per_s,
                               self.target_loss)


def write_run(directory: Path, record: RunRecord) -> Results:
    """Write every file of a run; results.json last, so its presence means complete. The
    trace as `record.trace` asks (testbed.report.chrome). results.json as types."""
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / "topology.yaml", to_yaml(dump_topology(record.topology)), 0o644)
    write_atomic(directory / "plan.csv", plan_to_csv(record.plan), 0o644)
    if record.trace != "none":
        kept, _ = trace_scope(record.plan, record.trace)
        write_trace(directory / TRACE_FILE,
                    trace_events(record.spans, record.start, record.topology, kept))
    with atomic_output(directory / "spans.json") as out:
        write_json_items(out, b'{"start":' + dumps(record.start) + b',"spans":[',
                         span_rows(record.spans), b"]}")
    if record.requests is not None:
        write_atomic(directory / "requests.csv", requests_csv(record.requests), 0o644)
    results = record.typed()
    write_atomic(directory / "results.json", strict_json(to_json(results), indent=True),
                 0o644)
    return results


def span_rows(spans: Sequence[Span]) -> Iterator[SpanRow]:
    """spans.json's rows: a span of one GPU as it is, a group's once with its `gpus`."""
    for gpus, kind, start, end, iteration, detail in rows(spans):
        where: dict[str, object] = {"gpu": gpus[0]} if len(gpus) == 1 else {"gpus": gpus}
        yield cast(SpanRow, {**where, "kind": kind, "start": start, "end": end,  # its keys
                             "iteration": iteration, **detail})


def requests_csv(rows: Sequence[RequestRow]) -> str:
    """One line per request: arrival, prefill start, GPU, time to first token (seconds
    since the run started) and what became of it."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(RequestRow.__annotations__),
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    return out.getvalue()


def strict_json(value: Any, indent: bool = False) -> str:
    """JSON any reader takes: a number JSON cannot hold (NaN or an infinity, as the loss
    of a diverged model) is written as null, never as the non-standard `NaN`; anything
    else without a JSON form as its str(). `indent`: one item per line."""
    return dumps(value, indent).decode()
