"""The one-screen summary of a run, from its results.json as types
(testbed.report.run_results)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from testbed.common.units import human_bytes, human_rate, plural
from testbed.errors import one_line
from testbed.metrics.loss import time_to_loss_text
from testbed.plan.queue_mismatch import mismatches_text
from testbed.report.run_results import Results
from testbed.scenario.link_traces import GENERATORS, TraceRecord
from testbed.scenario.scenario import FailureEntry
from testbed.scenario.slowdowns import StragglerEntry
from testbed.topology.net_events import EventEntry


def aligned(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A plain-text table a terminal, a log and a paper draft can all take: the header,
    a rule under it, then the rows, each column as wide as its widest cell; a cell (a
    policy's name or a reason read back from a file) as one printable line."""
    rows = [[one_line(str(cell)) for cell in row] for row in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _throughput(results: Results) -> str:
    """Tokens/s, and what it divides: the measured iterations' tokens over their time."""
    if not results.tokens_per_s:
        return "  throughput    -"
    tokens = results.tokens
    over = ""
    if tokens.measured_s:
        over = (f" ({tokens.measured:,} tokens in {tokens.measured_s:.3f} s"
                + (", first iteration excluded)" if len(results.iteration_time_s.all) > 1
                   else ")"))
    return f"  throughput    {results.tokens_per_s:.0f} tokens/s{over}"


def _loss(value: float | None) -> str:
    return "nan" if value is None else f"{value:.4f}"  # a diverged loss is null in JSON


def _cycle(results: Results) -> list[str]:
    """For a plan whose iterations differ: what a whole cycle takes, which tokens/s
    follows (the median iteration is one without the cycle's sync)."""
    cycle = results.cycle_time_s
    if cycle.period <= 1:
        return []
    return [f"  cycle         {cycle.period} iterations, mean {_secs(cycle.mean)} over "
            f"{plural(cycle.cycles, 'whole cycle')}"]


def _prediction(results: Results) -> list[str]:
    """The simulator's figure beside an emulated run's, and how the run was emulated."""
    lines = []
    if results.predicted_iteration_s is not None:
        error = results.prediction_error
        lines.append(f"  simulated     {_secs(results.predicted_iteration_s)} per iteration"
                     + (f" (emulated {error:+.1%} from it)" if error is not None else ""))
    if results.backend == "emulate" and results.dilation is not None:
        emulation = results.emulation
        lines.append(
            f"  emulation     dilation {results.dilation}, pacing "
            f"{'on' if results.pacing else 'off'}, cores "
            f"{_pct(emulation.get('cpu_busy') if emulation else None)} busy (workers "
            f"{_pct(emulation.get('workers_cpu') if emulation else None)}), event-loop lag "
            f"p99 {_secs(emulation.get('lag_p99_s') if emulation else None)}"
            + (f", busiest worker's actions {_pct(emulation.get('path_share'))} of its time"
               if emulation and emulation.get("path_share") is not None else "")
            + ("; machine-bound" if emulation and emulation.get("cpu_bound") else ""))
    memory = results.measured_memory
    if memory and memory.get("workers_peak_bytes"):
        predicted = memory.get("predicted")
        lines.append(
            f"  memory        workers {human_bytes(memory['workers_peak_bytes'])} at their "
            f"peaks, largest {human_bytes(memory['largest_worker_bytes'])} "
            f"({memory['largest_worker']}); coordinator "
            f"{human_bytes(memory['coordinator_peak_bytes'])}"
            + (f" (predicted: workers {human_bytes(predicted['workers_bytes'])}, "
               f"{human_bytes(predicted['total_bytes'])} in all)" if predicted else ""))
    return lines


def _wan_tcp(results: Results) -> list[str]:
    """A run's WAN connections as their kernels (or the model) left them: how many lost
    packets, where counted, and where their slow starts now stop."""
    connections = results.wan_connections or []
    if not connections:
        return []
    count = sum(c.get("connections", 1) for c in connections)
    lost = [c["retransmitted_segments"] for c in connections if c["retransmitted_segments"]]
    if any(c["retransmitted_segments"] is None for c in connections):
        losses = ""  # the simulator counts no segments
    elif lost:
        losses = f"{len(lost)} sent segments again ({_span(lost)} each); "
    else:
        losses = "none sent a segment again; "
    thresholds = [c["ssthresh_segments"] for c in connections
                  if c["ssthresh_segments"] is not None]
    stopping = sum(c.get("connections", 1) for c in connections
                   if c["ssthresh_segments"] is not None)
    return [f"  WAN TCP       {plural(count, 'connection')}: {losses}"
            + (f"slow start ends at {_span(thresholds)} segments on {stopping}"
               if thresholds else "all still in slow start")]


def _span(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def run_summary(results: Results) -> list[str]:
    it = results.iteration_time_s
    plan = results.plan
    util = results.gpu_utilization
    wan = results.wan
    lines = [
        f"{results.backend} run of {results.policy} on {results.topology}: "
        f"{results.status}" + (f" ({results.error})" if results.error else ""),
        f"  plan          dp {plan['dp']} x pp {plan['pp']}, "
        f"{plural(plan['microbatches'], 'microbatch', 'microbatches')}; compute "
        f"{results.compute}" + (f"; shaper {results.shaper}" if results.shaper else "")
        + (f"; from {results.plan_file}" if results.plan_file else ""),
        f"  iterations    {results.iterations} of {results.iterations_requested} completed",
        f"  iteration     median {_secs(it.median)}, min {_secs(it.min)}, "
        f"max {_secs(it.max)}" + (" (first excluded)" if len(it.all) > 1 else ""),
        *_cycle(results),
        *_prediction(results),
        _throughput(results),
        f"  GPU util      training {_pct(util.training)}, total {_pct(util.total)}",
        f"  WAN           {human_bytes(wan.bytes)} moved, utilization "
        f"{_pct(wan.utilization)}",
        *_wan_tcp(results),
    ]
    curve = results.loss_curve or []
    if curve:
        lines.append(f"  loss          {_loss(curve[0]['loss'])} -> {_loss(curve[-1]['loss'])} "
                     f"over {plural(len(curve), 'iteration')}")
    synced = results.synced_loss_curve or []
    if synced:
        lines.append(f"  synced loss   {_loss(synced[0]['loss'])} -> {_loss(synced[-1]['loss'])} "
                     "(the synchronized model, at the start and after each cycle)")
    if results.time_to_loss:
        lines.append(f"  time to loss  {time_to_loss_text(results.time_to_loss)}")
    inference = results.inference
    if inference.requests:
        ttft = inference.ttft_s
        expired = inference.expired
        lines.append(
            f"  inference     {inference.served} of {inference.requests} served"
            + (f" ({expired} after the deadline)" if expired else "")
            + f", {inference.rejected} rejected, TTFT p50 {_secs(ttft.p50)} p99 "
            f"{_secs(ttft.p99)}"
        )
    overruns = inference.overruns
    if overruns and overruns.get("prefills"):
        lines.append(
            f"  overruns      {overruns['overran']} of "
            f"{plural(overruns['prefills'], 'prefill')} held "
            f"training past their bubble, mean {_secs(overruns['mean_s'])} max "
            f"{_secs(overruns['max_s'])}")
    if results.training_slowdown is not None:
        lines.append(f"  slowdown      {results.training_slowdown:+.2%} vs no filling")
    lines += _lockstep(results)
    lines += _queue_mismatches(results)
    lines += _applied_counts(results)
    lines += _scenario(results)
    lines += _failures(results)
    return lines


def _lockstep(results: Results) -> list[str]:
    """Where equal shares held WAN transfers in step: real TCP drifts them apart, which
    can change the schedule; drawn shares show by how much."""
    counts = results.lockstep
    if not counts or not counts["in_step"]:
        return []
    return [f"  lockstep      {counts['in_step']} of {counts['contended']} WAN transfers "
            "that shared a link ran in step with another (equal shares hold them so, real "
            "TCP drifts them apart; --jitter share=CV draws each one's share where its "
            "congestion control has no sawtooth to draw it)"]


def _queue_mismatches(results: Results) -> list[str]:
    """Where the plan's flows cross WAN queues too shallow for their round trips."""
    text = mismatches_text(results.queue_mismatches or [])
    return [] if text is None else [f"  queues        {text}"]


Section = Sequence[Mapping[str, object]]
"""A section's entries: each with `applied`, where results.json says it."""


def _sections(results: Results) -> dict[str, Section]:
    """The run's network events and its scenario's entries, by section."""
    scenario = results.scenario
    return {"events": results.events,
            "traces": scenario.get("traces") or [] if scenario else [],
            "stragglers": scenario.get("stragglers") or [] if scenario else [],
            "failures": scenario.get("failures") or [] if scenario else []}


def _applied_counts(results: Results) -> list[str]:
    """How many of the run's network events and scenario entries it applied, where some
    began after training ended; nothing where all were applied, for a run without any,
    or from before it was recorded."""
    parts, late = [], False
    for section, items in _sections(results).items():
        known = [bool(item["applied"]) for item in items if "applied" in item]
        if known:
            parts.append(f"{section} {sum(known)} of {len(known)}")
            late = late or not all(known)
    if not late:  # each entry listed says so (_scenario)
        return []
    return [f"  applied       {', '.join(parts)} (the rest began after training ended)"]


LISTED = 10
"""Scenario entries and events listed one by one, at most; the rest are counted."""


def _scenario(results: Results) -> list[str]:
    """What the run was given to happen during it: the scenario's traces, stragglers and
    failures, and the network events (the topology's, the scenario's and --event's), as
    results.json records them, each marked with whether it took effect (`_applied`)."""
    scenario = results.scenario
    file = scenario.get("file") if scenario else None
    entries = []
    if scenario:
        entries += [("traces", i, _trace_text(t))
                    for i, t in enumerate(scenario.get("traces") or [])]
        entries += [("stragglers", i, _straggler_text(s))
                    for i, s in enumerate(scenario.get("stragglers") or [])]
        entries += [("failures", i, _loss_text(f))
                    for i, f in enumerate(scenario.get("failures") or [])]
    entries += [("events", i, _event_text(e)) for i, e in enumerate(results.events)]
    if not entries and not file:
        return []
    sections = _sections(results)
    texts = [text + _applied_text(_applied(sections, section, i))
             for section, i, text in entries]
    if len(texts) > LISTED:
        texts = [*texts[:LISTED - 1], f"and {len(texts) - LISTED + 1} more (results.json)"]
    head = f"  scenario      {file}" if file else None
    pad = "                "
    if head is None:
        return [f"  scenario      {texts[0]}", *(pad + t for t in texts[1:])]
    return [head + (": nothing in it" if not texts else ""), *(pad + t for t in texts)]


def _applied(sections: dict[str, Section], section: str, index: int) -> bool | None:
    """Whether the `index`-th entry of `section` (traces, stragglers, failures or events)
    took effect during the run, or None where results.json does not say (a run from
    before it was recorded)."""
    items = sections[section]
    if index >= len(items) or not isinstance(items[index], dict):
        return None
    applied = items[index].get("applied")
    return applied if isinstance(applied, bool) else None


def _applied_text(applied: bool | None) -> str:
    return {True: " (applied)", False: " (not applied: the run ended first)", None: ""}[applied]


def _trace_text(trace: TraceRecord) -> str:
    rates = trace.get("bandwidth")
    span = (f", {human_rate(rates['min'])} to {human_rate(rates['max'])}"
            if rates and rates.get("min") is not None else "")
    source = trace.get("csv") or next((g for g in GENERATORS if g in trace), "generated")
    return f"trace on {trace.get('link')}: {source}, {trace.get('steps', '?')} steps{span}"


def _straggler_text(straggler: StragglerEntry) -> str:
    lasting = f" for {straggler['for']}" if straggler.get("for") else ""
    return (f"straggler {straggler.get('gpu') or straggler.get('dc')} "
            f"{straggler.get('slower')}x slower from {straggler.get('at')}{lasting}")


def _loss_text(failure: FailureEntry) -> str:
    back = f", back at {failure['back']}" if failure.get("back") else ""
    return f"failure of {failure.get('worker')} at {failure.get('at')}{back}"


def _event_text(event: EventEntry) -> str:
    link = event.get("link")
    where = "-".join(link) if isinstance(link, list) else str(link)
    lasting = f" for {event['for']}" if event.get("for") else ""
    if "down" in event:
        return f"event: {where} down for {event['down']} at {event.get('at')}"
    for kind in ("latency", "bandwidth", "loss"):
        if kind in event:
            return f"event: {where} {kind} {event.get(kind, '')} at {event.get('at')}{lasting}"
    return f"event: {where} change  at {event.get('at')}{lasting}"


def _failures(results: Results) -> list[str]:
    """A scenario's failures: what each cost, the plan after a replan, and goodput."""
    failures = results.failures or []
    lines = []
    for failure in failures:
        line = f"  failure       {failure['worker']} lost at {failure['at_s']:.3g} s"
        if failure["resumed_s"] is None:
            lines.append(line + ": the run stopped")
            continue
        line += (f": {failure['action']} from iteration {failure['resumed_from']} at "
                 f"{failure['resumed_s']:.3g} s, {_secs(failure['time_lost_s'])} lost")
        after = failure["plan_after"]
        if after is not None and after != failure["plan_before"]:
            line += f"; then dp {after['dp']} x pp {after['pp']} on "
            line += plural(sum(len(gpus) for gpus in after["placement"].values()), "GPU")
        lines.append(line)
    if failures and results.goodput_tokens_per_s:
        lines.append(f"  goodput       {results.goodput_tokens_per_s:.0f} tokens/s over "
                     "the whole run, failures included")
    return lines
