"""Compute profiles: per-stage forward/backward times measured by a run, for the simulator."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.errors import InputError
from testbed.fsutil import write_atomic

Profile = dict[int, dict[str, float]]


def profile_from_spans(spans: Sequence[Mapping[str, Any]]) -> Profile:
    """Median forward and backward time per stage over all GPUs and iterations but the
    first (warm-up)."""
    samples: dict[int, dict[str, list[float]]] = {}
    for span in spans:
        kind = span["kind"]
        if kind not in ("forward", "backward") or span.get("iteration", 0) == 0:
            continue
        stage = int(span["stage"])
        samples.setdefault(stage, {}).setdefault(f"{kind}_s", []).append(
            span["end"] - span["start"])
    return {stage: {key: statistics.median(values) for key, values in kinds.items()}
            for stage, kinds in sorted(samples.items())}


def measured_spread(spans: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """How much the same work varied in time, as a coefficient of variation to give
    `--jitter`: forwards and backwards of each stage after the first iteration, and
    prefill passes of the same token count; pooled over those groups (None without two
    samples in a group)."""
    groups: dict[tuple[str, object], list[float]] = {}
    for span in spans:
        kind = span["kind"]
        if kind in ("forward", "backward") and span.get("iteration", 0) != 0:
            key: tuple[str, object] = ("compute", (kind, span["stage"]))
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


def write_profile(run_dir: Path, output: Path) -> Profile:
    spans_path = run_dir / "spans.json"
    try:
        spans = json.loads(spans_path.read_text())["spans"]
    except FileNotFoundError:
        raise InputError("no spans.json: not a results directory of `testbed up` or "
                         "`testbed simulate`", str(run_dir)) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"unreadable spans.json: {exc}", str(spans_path)) from None
    profile = profile_from_spans(spans)
    if not profile:
        raise InputError("no forward/backward spans after the first iteration to profile",
                         str(spans_path))
    results = run_dir / "results.json"
    source = json.loads(results.read_text()) if results.exists() else {}
    write_atomic(output, json.dumps({
        "source": str(run_dir), "compute": source.get("compute"),
        "topology": source.get("topology"), "policy": source.get("policy"),
        "spread": measured_spread(spans),
        "stages": {str(k): v for k, v in profile.items()}}, indent=1), 0o644)
    return profile


def load_profile(path: Path) -> Profile:
    source = str(path)
    try:
        data = json.loads(path.read_text())
        stages = data["stages"]
        profile = {int(stage): {key: float(value) for key, value in times.items()
                                if key in ("forward_s", "backward_s")}
                   for stage, times in stages.items()}
    except FileNotFoundError:
        raise InputError("no such file", source) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"not a profile (expected {{\"stages\": {{\"0\": {{\"forward_s\": "
                         f"...}}}}}}): {exc}", source) from None
    for stage, times in profile.items():
        for key, value in times.items():
            if not value >= 0:
                raise InputError(f"{key} must be zero or more", source, f"stages.{stage}.{key}")
    return profile
