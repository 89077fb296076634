"""Several policies on the same topology, job and seed, one after another: what `testbed
compare` and `api.compare` both run and write (compare.json, compare.csv, each run's
directory under runs/, topology.yaml for `testbed report`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypedDict

from testbed.common.choices import BackendName, OnFailure
from testbed.common.fsutil import own_directory, write_atomic
from testbed.common.sizes import MAX_REPEATS
from testbed.common.yamlio import to_yaml
from testbed.errors import InputError, TestbedError
from testbed.experiments.planning import shared_cache
from testbed.experiments.run import RunResult
from testbed.experiments.run import run as run_one
from testbed.plan.jitter import Jitter
from testbed.plan.model import Plan
from testbed.policy.registry import check_policies, given_plan_policy
from testbed.policy.routing import check_owners, options_for, variants
from testbed.report.compare import RunEntry, csv_text, table_rows
from testbed.report.results import strict_json
from testbed.report.run_dirs import one_name
from testbed.run.backend import Say
from testbed.run.spec import RunSpec
from testbed.topology import dump_topology

COMPARE_SCHEMA = 1
Started = Callable[[str], None]
"""Called with a run's name (`atlas+bubbletea-r2`) as it starts and as it ends."""


@dataclass(frozen=True)
class GivenRun:
    """A given plan compared beside the policies: its row's `label` (the file as given, or
    `plan:POLICY`), the checked plan and the file it came from (None for a Plan)."""

    label: str
    plan: Plan
    plan_file: str | None


@dataclass(frozen=True)
class ComparisonRun:
    """One run of a comparison: its directory's `name` (`atlas+bubbletea-r2`), its row's
    `label` (the policy, or a given plan's), which repeat, and what runs."""

    name: str
    label: str
    repeat: int
    spec: RunSpec


def check_repeat(repeat: int, flag: str = "--repeat") -> None:
    """Runs per combination: from 1 to MAX_REPEATS (testbed.common.sizes), refused before
    any run is made."""
    if not 1 <= repeat <= MAX_REPEATS:
        raise InputError(f"must be from 1 to {MAX_REPEATS:,} (testbed's limit), got "
                         f"{repeat:,}", flag)


def comparison_runs(base: RunSpec, policies: Sequence[str], bubbles: Sequence[str],
                    options: Sequence[str], repeat: int, plans: Sequence[GivenRun] = ()
                    ) -> list[ComparisonRun]:
    """Every run: each policy and each given plan with each bubble policy, `repeat` times,
    repeat k seeding the jitter with the job's seed + k (every combination meets the same
    noise in its k-th repeat). `policies`: as `-p` names them, `POLICY` or a labelled
    variant `POLICY:LABEL` (testbed.policy.routing); `options`: `-o [OWNER.]KEY=VALUE`,
    for policies (a given plan takes none). Every policy and option is checked first."""
    check_repeat(repeat)
    chosen = variants(policies)
    names = list(dict.fromkeys([*(v.policy for v in chosen), *policies]))
    check_owners(options, [*names, *bubbles])
    check_policies([(v.policy, options_for(v.policy, options, label=v.name)) for v in chosen],
                   [(b, options_for(b, options, False)) for b in bubbles])
    rows: list[tuple[str, str, Plan | None, str | None]] = [
        (v.name, v.policy, None, None) for v in chosen]
    rows += [(given.label, given_plan_policy(given.plan, None), given.plan, given.plan_file)
             for given in plans]
    out = []
    for label, policy, plan, plan_file in rows:
        for bubble in bubbles or (None,):
            for k in range(repeat):
                name = f"{one_name(label)}{'+' + bubble if bubble else ''}-r{k + 1}"
                noise = base.simulate.jitter
                out.append(ComparisonRun(name, label, k, base.with_settings(
                    policy=policy,
                    policy_options=options_for(policy, options, label=label)
                    if plan is None else {},
                    plan=plan, plan_file=plan_file,
                    bubble_policy=bubble,
                    bubble_options=options_for(bubble, options, False) if bubble else None,
                    jitter=(noise if noise is not None else Jitter()).with_seed(
                        base.job.seed + k) if base.backend == "simulate" else noise)))
    return out


def run_comparison(runs: Sequence[ComparisonRun], directory: Path,
                   started: Started = lambda _n: None, ended: Started = lambda _n: None,
                   say: Say = lambda _m: None) -> list[tuple[RunEntry, RunResult | None]]:
    """Every run into `directory`/runs/NAME, planned with one shared cache (ablations
    reuse their parent's search); a run that fails is a `failed` entry, the others
    still run. `say`: a run's progress lines (the emulator's)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / "topology.yaml", to_yaml(dump_topology(runs[0].spec.topology)),
                 0o644)
    out = []
    with shared_cache():
        for run in runs:
            started(run.name)
            out.append(_run(run, directory, say))
            ended(run.name)
    return out


def _run(run: ComparisonRun, directory: Path, say: Say) -> tuple[RunEntry, RunResult | None]:
    run_dir = own_directory(directory, "runs", run.name)  # never through a link there
    relative = str(run_dir.relative_to(directory))
    bubble = run.spec.common.bubble_policy
    try:
        outcome = run_one(run.spec, run_dir, say)
    except TestbedError as exc:
        return RunEntry(run.label, bubble, run.repeat, relative, "failed", str(exc),
                        None), None
    results = outcome.results
    return RunEntry(run.label, bubble, run.repeat, relative, results["status"],
                    results.get("error"), results), outcome


class CompareConfig(TypedDict):
    """A comparison's settings, as compare.json opens with them."""

    topology: str | None
    backend: BackendName
    policies: list[str]
    plans: list[str]
    bubbles: list[str]
    repeat: int
    options: list[str]
    job_overrides: dict[str, object]
    """The job's flags as given (`testbed compare`'s): a value each, whatever its type."""
    jitter: dict[str, float] | None
    target_loss: float | None
    loss_model: str
    scenario: str | None
    on_failure: OnFailure


def write_compare(directory: Path, config: CompareConfig, entries: list[RunEntry]) -> None:
    """compare.json: the settings, each combination's row as the table shows it (speed-up,
    time to loss), and every run with its results; compare.csv: one line per run."""
    rows = [asdict(row) for row in table_rows(entries)]
    write_atomic(directory / "compare.json", strict_json(
        {"schema": COMPARE_SCHEMA, **config, "rows": rows,
         "runs": [e.as_dict() for e in entries]}, indent=True), 0o644)
    write_atomic(directory / "compare.csv", csv_text(entries), 0o644)
