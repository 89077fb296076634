"""The testbed from Python, for experiments scripted rather than typed (a notebook, a
sweep of one's own). Every command is a thin layer over these functions, so a script
gets the same runs, files and typed results:

    from testbed import api

    inputs = api.load("topologies/paper-3dc.yaml", iterations=3)
    print(api.plan(inputs, "atlas").placement)
    runs = api.compare(inputs, ["gpipe", "atlas"])
    speedup = runs["atlas"].speedup(runs["gpipe"])   # a ratio of tokens/s
    mine = api.simulate(inputs, plan="my-plan.csv")   # a saved or hand-edited plan

Errors are the commands' errors: `testbed.errors.InputError` (bad input, naming the file
and key), `TestbedError` for the rest.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from testbed.common.choices import BackendName
from testbed.common.codec import JsonObject
from testbed.errors import InputError, TestbedError
from testbed.experiments.comparison import (
    GivenRun,
    check_repeat,
    comparison_runs,
    run_comparison,
    write_compare,
)
from testbed.experiments.inputs import Inputs, load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.experiments.run import run as run_spec
from testbed.metrics.loss import TimeToLoss
from testbed.metrics.summary import speedup
from testbed.plan.load import given_plan
from testbed.plan.model import Plan
from testbed.policy import training_policy
from testbed.policy.registry import DEFAULT_POLICY, check_policies, given_plan_policy
from testbed.report.compare import Row, RunEntry, table_rows
from testbed.report.results import RunRecord, new_run_dir
from testbed.report.run_dirs import remove_if_empty
from testbed.report.run_results import Results
from testbed.run.backend import Say
from testbed.run.checkpoint import Progress
from testbed.run.settings import Command, Named, checked
from testbed.run.spec import RunSpec, run_settings

__all__ = ["Comparison", "Inputs", "Plan", "Result", "RunSpec", "compare", "emulate", "load",
           "plan", "run", "simulate"]

@dataclass(frozen=True)
class Result:
    """One run: its directory (results.json, spans, trace), its typed record, and the
    error that ended it early, if one did."""

    directory: Path
    record: RunRecord
    typed: Results
    """results.json as types (testbed.report.run_results)."""
    error: TestbedError | None = None

    @property
    def results(self) -> JsonObject:
        """results.json as written: the document, for code that reads JSON."""
        return self.typed.document()

    @property
    def iteration_s(self) -> float:
        """Median seconds per training iteration (the first, warm-up, left out)."""
        median = self.record.summary.median_s
        if median is None:
            raise ValueError(f"the run in {self.directory} measured no iteration")
        return median

    @property
    def tokens_per_s(self) -> float:
        """Tokens of the measured iterations over the time they took (the first
        iteration, warm-up, left out): what runs are compared by."""
        rate = self.record.summary.tokens_per_s
        if rate is None:
            raise ValueError(f"the run in {self.directory} measured no iteration")
        return rate

    def speedup(self, baseline: Result) -> float:
        """How many times the baseline's throughput (tokens/s) this run had: not a ratio
        of iteration times, which would charge a policy for doing more per iteration."""
        ratio = speedup(self.tokens_per_s, baseline.tokens_per_s)
        assert ratio is not None  # both rates are positive
        return ratio

    @property
    def time_to_loss(self) -> TimeToLoss | None:
        """Time and tokens to the target loss (`target_loss=`), or why there are none;
        None when no target was given."""
        return self.typed.time_to_loss


def load(topology: str | Path, job: str | Path | None = None, *,
         sets: Mapping[str, object] | None = None, events: Sequence[str] = (),
         scenario: str | Path | None = None, **job_values: object) -> Inputs:
    """A topology file and its job, as `testbed validate` reads them. `job`: a job file
    replacing the topology's; `sets`: dotted keys as `--set` takes them
    (`{"model.layers": 8}`); `job_values`: the job flags (iterations, microbatches, dp,
    pp, seed); `events`: network events as `--event` takes them; `scenario`: a scenario
    file (link traces, stragglers, failures) as `--scenario` takes it."""
    given = _mapping(sets, "sets", "{'model.layers': 8}")
    overrides = tuple(f"{key}={value}" for key, value in given.items())
    overrides += tuple(f"{key}={value}" for key, value in job_values.items())
    return load_inputs(Path(topology), Path(job) if job else None, overrides,
                       _texts(events, "events", "['at=30s,link=east-west,down=5s']"),
                       Path(scenario) if scenario is not None else None)


def _mapping(value: object, name: str, example: str) -> dict[str, object]:
    """A mapping argument, or a one-line InputError naming it (`KEY=VALUE` texts are how
    the commands take these, not the functions)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(f"expected a mapping like {example}, got {_kind(value)}", None, name)
    return dict(value)


def _options(value: object, name: str = "options") -> JsonObject:
    """Policy options as given: raw, for the policy's own parser to check."""
    return _mapping(value, name, "{'connections': '8'}")


def _texts(value: object, name: str, example: str) -> tuple[str, ...]:
    """A list of texts, or a one-line InputError naming it (one text alone would be taken
    a character at a time)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) \
            or not all(isinstance(item, str) for item in value):
        raise InputError(f"expected a list of texts like {example}, got {_kind(value)}", None,
                         name)
    return tuple(value)


def _kind(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


def plan(inputs: Inputs, policy: str = DEFAULT_POLICY,
         options: Mapping[str, str] | None = None) -> Plan:
    """The policy's validated plan, as `testbed plan` shows it."""
    chosen = training_policy(policy, _options(options))
    return plan_with_simulator(chosen, inputs.topology, inputs.job)


def check(spec: RunSpec) -> None:
    """The run's policies built with their options: a mistyped name or option is a
    one-line error before anything is made."""
    common = spec.common
    check_policies([(spec.policy, common.policy_options)],
                   [(common.bubble_policy, common.bubble_options or {})]
                   if common.bubble_policy else [])


def run(spec: RunSpec, out: str | Path | None = None, say: Say = lambda _m: None,
        resume: Progress | None = None) -> Result:
    """Any run, every setting spelled out (testbed.run.spec.RunSpec); `out`: its
    directory (default: a new one under runs/); `resume`: go on from that checkpoint of
    the run in `out` (testbed.emulator.resume.load_resumption)."""
    check(spec)
    directory = Path(out) if out is not None else new_run_dir(spec.topology.name, spec.policy)
    try:
        outcome = run_spec(spec, directory, say, resume)
    except BaseException:
        if out is None:
            remove_if_empty(directory)  # refused before it wrote anything
        raise
    assert outcome.record is not None
    return Result(outcome.directory, outcome.record, outcome.typed, outcome.error)


GivenPlan = str | Path | Plan
"""A plan to run instead of a policy's: a file (a plan's CSV, saved or edited by hand, or
torch's CSV form of a schedule) or a Plan; checked before anything runs
(testbed.plan.load.given_plan)."""


def spec_for(backend: BackendName, inputs: Inputs, settings: Mapping[str, Any]) -> RunSpec:
    """A run of `inputs` with `settings` by their fields' names (testbed.run.spec), as the
    commands and the functions here give them: `plan` a file or a Plan, run under `policy`
    when one is given, else the plan's own; `jitter` seeded by the job's seed."""
    given = dict(settings)
    plan = given.pop("plan", None)
    jitter = given.get("jitter")
    if "jitter" in given:
        given["jitter"] = jitter.with_seed(inputs.job.seed) if jitter is not None else None
    spec = RunSpec.build(backend, inputs.topology, inputs.job, inputs.scenario,
                         events=inputs.events, **given)
    return with_given_plan(spec, plan, given.get("policy"))


def refuse_the_other_backends(backend: BackendName, settings: Mapping[str, Any]) -> None:
    """Settings of the other backend's, refused for a comparison that runs on one."""
    if backend == "simulate" and settings.get("dilation", 1) != 1:
        raise InputError("applies to --backend emulate only (the simulator has no clock "
                         "to slow down)", "--dilation")
    if backend == "emulate" and settings.get("jitter"):
        raise InputError("applies to --backend simulate only (an emulated run has its own "
                         "noise)", "--jitter")


F = TypeVar("F", bound=Callable[..., Any])


def _taking(command: Command) -> Callable[[F], F]:
    """A function that takes, by keyword, the settings `command` takes (testbed.run.spec):
    its signature and docstring name each, with its default and its text."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        names = {p.name for p in own}
        made = [inspect.Parameter(
            named.api_name, inspect.Parameter.KEYWORD_ONLY, default=named.default,
            annotation="GivenPlan | None" if named.name == "plan" else named.field.type)
            for named in _taken(command) if named.api_name not in names]
        at = [p.name for p in own].index("out")  # the settings, then where the run goes
        func.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*own[:at], *made, *own[at:]])
        func.__doc__ = (func.__doc__ or "") + "\n\nSettings (testbed.run.spec):\n\n" + \
            "\n".join(f"- `{n.api_name}`: {n.doc}" for n in _taken(command))
        return func

    return decorate


def _taken(command: Command) -> list[Named]:
    return [named for named in run_settings().values() if named.takes(command)]


def _settings(command: Command, function: str, given: Mapping[str, object]
              ) -> dict[str, Any]:
    """The settings a function was given, by their API names: each checked against its
    field's type (a text read as its option reads it), by its field's name (the spec's
    keyword arguments)."""
    by_name = {named.api_name: named for named in _taken(command)}
    out: dict[str, Any] = {}  # keyword arguments: each value its own field's type
    for key, value in given.items():
        named = by_name.get(key)
        if named is None:
            raise TypeError(f"{function}() got an unexpected keyword argument {key!r}")
        out[named.name] = value if named.name == "plan" else checked(named, value, key)
    return out


def _spec(command: Command, function: str, inputs: Inputs, policy: str | None,
          options: object, settings: Mapping[str, object]) -> RunSpec:
    """The run a function of one run was given."""
    given = {**({"policy": policy} if policy else {}), "policy_options": _options(options),
             **_settings(command, function, settings)}
    with _said_of_parameters(command):
        return spec_for("simulate" if command == "simulate" else "emulate", inputs, given)


@contextlib.contextmanager
def _said_of_parameters(command: Command) -> Iterator[None]:
    """A setting the spec refuses, said of the function's parameter, not of the option."""
    try:
        yield
    except InputError as exc:
        for named in _taken(command):
            if named.setting is not None and exc.source == named.setting.flag:
                raise InputError(exc.problem, None, named.api_name) from None
        raise


@_taking("simulate")
def simulate(inputs: Inputs, policy: str | None = None,
             options: Mapping[str, str] | None = None, *, out: str | Path | None = None,
             **settings: object) -> Result:
    """`testbed simulate`: the plan at any scale, modeled compute, flow-level network (the
    time to a `target_loss` predicted by `loss_model` from the run's tokens/s: results'
    `time_to_loss` and `loss_model`). `plan`: run this one; `policy`
    then labels the run and answers its hooks (default: the plan's own, else `plan-file`;
    see testbed.policy.given); without a plan it defaults to the default policy.
    `on_failure` and `checkpoint_every`: what the scenario's failures do
    (testbed.run.recovery)."""
    spec = _spec("simulate", "simulate", inputs, policy, options, settings)
    return run(spec, out)


@_taking("up")
def emulate(inputs: Inputs, policy: str | None = None,
            options: Mapping[str, str] | None = None, *, out: str | Path | None = None,
            say: Say = print, **settings: object) -> Result:
    """`testbed up`: real processes over the emulated WAN (needs root). `dilation`: run K
    times slower than represented time, "auto" (or None) to choose K from this machine;
    `target_loss`: report the time to reach it (`Result.time_to_loss`: measured with real
    compute, else predicted); `plan`, `on_failure`, `checkpoint_every` and `loss_model`:
    as for `simulate`."""
    if "dilation" in settings and settings["dilation"] is None:
        settings["dilation"] = "auto"
    spec = _spec("up", "emulate", inputs, policy, options, settings)
    return run(spec, out, say)


class Comparison(Mapping[str, Result]):
    """What `compare` ran: by combination (`atlas`, `atlas+bubbletea`) the run of its first
    repeat (the job's own seed), every repeat in `repeats`, and the table `testbed
    compare` prints in `rows` (median and spread over repeats, speed-up against the first
    policy, slowdown against `+none` with its 95% interval). Files as the command writes
    them, in `directory`."""

    def __init__(self, directory: Path, entries: list[RunEntry],
                 repeats: dict[str, list[Result]]) -> None:
        self.directory = directory
        self.entries = entries
        self.repeats = repeats

    def __getitem__(self, combo: str) -> Result:
        return self.repeats[combo][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self.repeats)

    def __len__(self) -> int:
        return len(self.repeats)

    @property
    def rows(self) -> list[Row]:
        return table_rows(self.entries)


@_taking("compare")
def compare(inputs: Inputs, policies: Sequence[str], *, plans: Sequence[GivenPlan] = (),
            backend: BackendName = "simulate",
            options: Mapping[str, object] | None = None, bubbles: Sequence[str] = (),
            repeat: int = 1, out: str | Path | None = None, say: Say = lambda _m: None,
            **settings: object) -> Comparison:
    """`testbed compare`: each policy, and each given plan beside them (keyed by its file as
    given, or `plan:POLICY` for a Plan), with each bubble policy, `repeat` times, on the
    same inputs, by one backend, planned with one shared cache (so ablations reuse their
    parent's search). `policies`: as `-p` names them, a policy or a labelled variant of
    one (`["diloco:h10", "diloco:h100"]`, keyed by the label). `options`: as `-o` takes
    them (`{"atlas.connections": 8}` for one policy, `{"diloco:h10.inner_steps": 10}` for
    one variant, `{"connections": 8}` for every training policy, the most specific
    winning; `{"bubbletea.KEY": V}` for a bubble policy); `jitter`: as `--jitter` takes
    it (simulator; repeat k is seeded with the job's seed + k); `out`: the comparison's
    directory, written as the command writes it; `compute`: the emulator's (loss needs
    "real"); the inputs' scenario, with `on_failure` and `checkpoint_every`, in every
    run. A run that fails is kept with its error (`Result.error`, or a `failed` row).
    Compare runs by `Result.time_to_loss` (measured with real compute, else predicted by
    `loss_model`), `Result.speedup` (tokens/s) beside it."""
    check_repeat(repeat, "repeat")
    given_settings = _settings("compare", "compare", settings)
    policies = _texts(policies, "policies", "['gpipe', 'atlas']")
    bubbles = _texts(bubbles, "bubbles", "['bubbletea']")
    given_options = _mapping(options, "options", "{'atlas.connections': 8}")
    pairs = [f"{key}={value}" for key, value in given_options.items()]
    with _said_of_parameters("compare"):
        refuse_the_other_backends(backend, given_settings)
        base = spec_for(backend, inputs, given_settings)
    noise = given_settings.get("jitter")
    given: list[GivenRun] = []
    for plan in plans:
        checked = with_given_plan(base, plan, None)
        key = checked.common.plan_file or f"plan:{checked.policy}"
        label, n = key, 1
        while label in {*policies, *(g.label for g in given)}:  # a Plan or file twice
            n += 1
            label = f"{key}#{n}"
        assert checked.common.plan is not None
        given.append(GivenRun(label, checked.common.plan, checked.common.plan_file))
    runs = comparison_runs(base, policies, bubbles, pairs, repeat, given)
    directory = Path(out) if out is not None else new_run_dir(inputs.topology.name, "compare")
    done = run_comparison(runs, directory, say=say)
    entries = [entry for entry, _ in done]
    write_compare(directory, {"topology": inputs.topology.source, "backend": backend,
                              "policies": list(policies),
                              "plans": [g.plan_file or g.label for g in given],
                              "bubbles": list(bubbles),
                              "repeat": repeat, "options": pairs, "job_overrides": {},
                              "jitter": noise.as_dict() if noise is not None else None,
                              "target_loss": base.common.target_loss,
                              "loss_model": base.common.loss_model,
                              "scenario": inputs.scenario.source,
                              "on_failure": base.common.on_failure}, entries)
    repeats: dict[str, list[Result]] = {}
    for entry, outcome in done:
        if outcome is None or outcome.record is None:
            continue  # refused before it ran: its entry says why
        repeats.setdefault(entry.combo, []).append(Result(
            outcome.directory, outcome.record, outcome.typed, outcome.error))
    return Comparison(directory, entries, repeats)


def with_given_plan(spec: RunSpec, plan: GivenPlan | None, policy: str | None) -> RunSpec:
    """`spec` running a given plan (checked before anything runs), under `policy` when one
    was asked for, else the plan's own (or plan-file: testbed.policy.given); `spec`
    itself without a plan."""
    if plan is None:
        return spec
    checked, source = given_plan(plan, spec.topology, spec.job)
    return spec.with_settings(policy=given_plan_policy(checked, policy), plan=checked,
                              plan_file=source)

