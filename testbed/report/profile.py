"""Compute profiles measured: per-stage forward/backward times of a run, read from its
spans, for the simulator to run on (the profile itself, and reading one back, is
testbed.plan.profile's)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.common.fsutil import write_atomic, write_named
from testbed.common.jsonio import read_json
from testbed.common.sizes import MAX_RUN_S
from testbed.errors import InputError
from testbed.plan.profile import Profile
from testbed.report.saved import INTEGER, OPTIONAL_TEXT, check, per_gpu, read_span_rows

Spread = dict[str, float | None]
"""A coefficient of variation per kind of work (None where not measured)."""


def profile_from_spans(spans: Sequence[Mapping[str, Any]]) -> Profile:
    """Median forward and backward time per stage over all GPUs and iterations but the
    first (warm-up). A stage whose backwards were all split (I and W spans) gets the sum
    of its parts' medians as its backward."""
    samples: dict[int, dict[str, list[float]]] = {}
    for span in spans:
        kind = span["kind"]
        if kind not in ("forward", "backward") or span.get("iteration", 0) == 0:
            continue
        stage = int(span["stage"])
        key = f"{kind}_s" if span.get("part") is None else f"{kind}_{span['part']}"
        samples.setdefault(stage, {}).setdefault(key, []).append(span["end"] - span["start"])
    profile: Profile = {}
    for stage, kinds in sorted(samples.items()):
        medians = {key: statistics.median(values) for key, values in kinds.items()}
        parts = [medians.pop(f"backward_{part}", None) for part in ("I", "W")]
        if "backward_s" not in medians and parts[0] is not None and parts[1] is not None:
            medians["backward_s"] = parts[0] + parts[1]
        profile[stage] = medians
    return profile


def measured_spread(spans: Sequence[Mapping[str, Any]]) -> Spread:
    """How much the same work varied in time, as a coefficient of variation to give
    `--jitter`: forwards and backwards of each stage after the first iteration, and
    prefill passes of the same token count; pooled over those groups (None without two
    samples in a group)."""
    groups: dict[tuple[str, object], list[float]] = {}
    for span in spans:
        kind = span["kind"]
        if kind in ("forward", "backward") and span.get("iteration", 0) != 0:
            key: tuple[str, object] = ("compute", (kind, span.get("part"), span["stage"]))
        elif kind == "prefill":
            key = ("prefill", span.get("tokens"))
        else:
            continue
        groups.setdefault(key, []).append(span["end"] - span["start"])
    out: dict[str, float | None] = {}
    for kind in ("compute", "prefill"):
        spreads = [(len(v), statistics.stdev(v) / statistics.fmean(v))
                   for (k, _), v in groups.items()
                   if k == kind and len(v) > 1 and statistics.fmean(v) > 0]
        total = sum(n - 1 for n, _ in spreads)
        out[kind] = (sum((n - 1) * cv**2 for n, cv in spreads) / total) ** 0.5 if total else None
    return out


def write_profile(run_dir: Path, output: Path | None) -> tuple[Profile, Spread]:
    """Measure a run's profile and write it: to `output` (a file the user named, `-o`),
    else RUN_DIR/profile.json; the per-stage times and the spread it holds."""
    spans_path = run_dir / "spans.json"
    if not spans_path.exists():
        raise InputError("no spans.json: not a results directory of `testbed up` or "
                         "`testbed simulate`", str(run_dir))
    spans = read_spans(spans_path)
    profile = profile_from_spans(spans)
    if not profile:
        raise InputError("no forward/backward spans after the first iteration to profile",
                         str(spans_path))
    results = run_dir / "results.json"
    source: dict[str, Any] = {}  # results.json as read: raw JSON, checked below
    if results.exists():
        source = read_json(results)
        check(source, {key: OPTIONAL_TEXT for key in SOURCE_KEYS}, str(results))
    spread = measured_spread(spans)
    text = json.dumps({
        "source": str(run_dir), **{key: source.get(key) for key in SOURCE_KEYS},
        "spread": spread, "stages": {str(k): v for k, v in profile.items()}},
        indent=1, allow_nan=False)
    if output is None:
        write_atomic(run_dir / "profile.json", text, 0o644)
    else:
        write_named(output, text, "-o")
    return profile, spread


SOURCE_KEYS = ("compute", "topology", "policy")
TIMED = {"stage": INTEGER, "iteration": INTEGER}
"""What a compute span needs beyond SPAN's keys to be profiled."""


def read_spans(path: Path) -> list[Mapping[str, Any]]:
    """A run's spans.json, checked where a profile reads it: one located error (exit 2)
    for a damaged file, never a traceback or a NaN carried into the profile."""
    _, spans = read_span_rows(path)
    for i, span in enumerate(spans):
        if span["kind"] in ("forward", "backward", "prefill"):
            check(span, TIMED if span["kind"] != "prefill" else {}, str(path), f"spans[{i}]")
            if "tokens" in span:
                check(span["tokens"], INTEGER, str(path), f"spans[{i}].tokens")
            for key in ("start", "end"):
                if not -MAX_RUN_S <= span[key] <= MAX_RUN_S:  # finite: read_span_rows
                    raise InputError(f"{span[key]:g} s is past the times a run has (at most "
                                     f"{MAX_RUN_S:g} s from its start)", str(path),
                                     f"spans[{i}].{key}")
            if span["end"] < span["start"]:
                raise InputError(f"ends ({span['end']}) before it starts ({span['start']})",
                                 str(path), f"spans[{i}].end")
    return list(per_gpu(spans))
