"""A compute profile: per-stage forward and backward times a run measured, which a run's
settings may give the cost model instead of its FLOP figures (testbed.plan.compute reads
it). It lives in plan/, beside that cost model: the run's settings (testbed.run.spec) and
the simulator both read it, and it needs nothing but a JSON file; measuring one from a
run's spans is testbed.report.profile's."""

from __future__ import annotations

from pathlib import Path

from testbed.common.jsonio import read_json
from testbed.errors import InputError

Profile = dict[int, dict[str, float]]


def load_profile(path: Path) -> Profile:
    source = str(path)
    data = read_json(path)
    try:
        stages = data["stages"]
        profile = {int(stage): {key: float(value) for key, value in times.items()
                                if key in ("forward_s", "backward_s")}
                   for stage, times in stages.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"not a profile (expected {{\"stages\": {{\"0\": {{\"forward_s\": "
                         f"...}}}}}}): {exc}", source) from None
    for stage, times in profile.items():
        for key, value in times.items():
            if not value >= 0:
                raise InputError(f"{key} must be zero or more", source, f"stages.{stage}.{key}")
    return profile
