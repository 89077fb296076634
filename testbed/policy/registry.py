"""Finding policy plugins through entry points; built-ins register the same way.

Choosing a policy imports only the plugin that provides it, so one plugin's import cost or
breakage never reaches a command that uses another. A plugin that fails to import, or is
written for another policy API version, is kept as an entry with its error, so that
listing and every other policy keep working; only choosing it fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol

from testbed.errors import InputError, PluginError, did_you_mean
from testbed.job.model import Job
from testbed.plan.model import Plan
from testbed.plan.validate import validate_plan
from testbed.policy.base import API_VERSION, BubblePolicy, Option, TrainingPolicy
from testbed.policy.context import PlanningContext
from testbed.policy.given import PLAN_FILE, GivenPlanHooks
from testbed.policy.guard import PluginCrash, plugin_code
from testbed.topology.model import Topology

DEFAULT_POLICY = "1f1b"
"""The training policy of every command and API call that is not told one: the pipeline
schedule most training systems run."""
DEFAULT_COMPARISON = (DEFAULT_POLICY, "atlas")
"""What `compare` runs when not told: the default baseline, then Atlas against it."""
TRAINING_GROUP = "testbed.policies"
BUBBLE_GROUP = "testbed.bubbles"
_BASES: dict[str, type[Any]] = {TRAINING_GROUP: TrainingPolicy, BUBBLE_GROUP: BubblePolicy}


@dataclass(frozen=True)
class PluginInfo:
    name: str
    group: str
    target: str
    distribution: str
    cls: type[Any] | None = None
    error: str | None = None
    summary: str = ""
    options: tuple[Option, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)
    """What `testbed plugins` lists of it, read as it was loaded (plugin code: a
    `summary` that raises is the plugin's load error, not the listing's end)."""

    @property
    def ok(self) -> bool:
        return self.error is None


def discover(group: str) -> dict[str, PluginInfo]:
    """Every plugin registered under `group`, by name, loaded or with its load error."""
    by_name: dict[str, list[EntryPoint]] = {}
    for entry in sorted(entry_points(group=group), key=lambda e: e.name):
        by_name.setdefault(entry.name, []).append(entry)
    return {name: _resolve(name, group, entries) for name, entries in by_name.items()}


def _distribution(entry: EntryPoint) -> str:
    return entry.dist.name if entry.dist is not None else "unknown"


def _resolve(name: str, group: str, entries: list[EntryPoint]) -> PluginInfo:
    """One name's plugin; two distributions claiming the name is an error found from the
    metadata alone, without importing either."""
    dists = list(dict.fromkeys(_distribution(e) for e in entries))
    if len(dists) > 1:
        return PluginInfo(name, group, entries[-1].value, ", ".join(dists),
                          error=f"registered by both {' and '.join(dists)}")
    return _load(entries[-1], group)


def _load(entry: EntryPoint, group: str) -> PluginInfo:
    dist = _distribution(entry)

    def broken(error: str) -> PluginInfo:
        return PluginInfo(entry.name, group, entry.value, dist, error=error)

    base = _BASES[group]
    summary: Any = ""
    options: tuple[Any, ...] = ()
    fixed: dict[str, Any] = {}  # the class's own `fixed`: its settings' keyword arguments
    try:  # importing it, and whatever its class runs when read (a descriptor, a metaclass)
        with plugin_code("", entry.module):
            obj = entry.load()
            if not (isinstance(obj, type) and issubclass(obj, base)):
                return broken(f"{entry.value} is not a subclass of {base.__name__}")
            policy: Any = obj
            registered_as = getattr(policy, "name", None)
            version = getattr(policy, "api_version", None)
            if registered_as == entry.name and version == API_VERSION:
                summary, options, fixed = policy.summary, tuple(policy.options), \
                    dict(policy.fixed)
    except PluginCrash as exc:  # a broken plugin must not break the CLI
        return broken(exc.detail)
    if registered_as != entry.name:
        return broken(f"{entry.value}.name is {registered_as!r}, registered as {entry.name!r}")
    if version != API_VERSION:
        return broken(f"written for policy API version {version}, this testbed supports "
                      f"version {API_VERSION}")
    if not isinstance(summary, str) or not all(isinstance(o, Option) for o in options):
        return broken(f"{entry.value}: its summary is not text, or its options are not "
                      "made from its settings")
    return PluginInfo(entry.name, group, entry.value, dist, cls=obj, summary=summary,
                      options=options, fixed=fixed)


def _pick(group: str, name: str, what: str) -> type[Any]:
    registered = sorted(entry_points(group=group), key=lambda e: e.name)
    entries = [e for e in registered if e.name == name]
    if not entries:
        names = list(dict.fromkeys(e.name for e in registered))
        raise InputError(f"unknown {what} {name!r}{did_you_mean(name, names)}; installed: "
                         f"{', '.join(names) or 'none'} (see `testbed plugins`)")
    info = _resolve(name, group, entries)
    if info.cls is None:
        raise PluginError(f"{what} {name!r} from {info.distribution} is broken: {info.error}")
    return info.cls


def training_policy(name: str, options: dict[str, str] | None = None) -> TrainingPolicy:
    """The installed policy `name` with its options; `plan-file` is the built-in one of a
    run given its plan (testbed.policy.given)."""
    cls = GivenPlanHooks if name == PLAN_FILE else _pick(TRAINING_GROUP, name,
                                                         "training policy")
    policy: TrainingPolicy = _construct(cls, name, options or {})
    return policy


def installed(name: str) -> bool:
    """Whether a training policy of that name is registered (without importing it)."""
    return any(entry.name == name for entry in entry_points(group=TRAINING_GROUP))


def given_plan_policy(plan: Plan, policy: str | None) -> str:
    """The policy of a run given its plan (testbed.policy.given): the one asked for
    (`-p`), else the plan's own when it is installed, else `plan-file`."""
    if policy is not None:
        return policy
    return plan.policy if installed(plan.policy) else PLAN_FILE


def bubble_policy(name: str, options: dict[str, str] | None = None) -> BubblePolicy:
    cls = _pick(BUBBLE_GROUP, name, "bubble policy")
    policy: BubblePolicy = _construct(cls, name, options or {})
    return policy


def check_policies(training: Sequence[tuple[str, Mapping[str, str]]],
                   bubbles: Sequence[tuple[str, Mapping[str, str]]] = ()) -> None:
    """Every chosen policy built with its options, as a run builds it, so that a mistyped
    name or option is a one-line error before anything runs (not a failed run, minutes
    into a comparison)."""
    for name, options in training:
        training_policy(name, dict(options))
    for name, options in bubbles:
        bubble_policy(name, dict(options))


def _construct(cls: type[Any], name: str, options: dict[str, str]) -> Any:
    with plugin_code(f"policy {name!r} failed to start", cls.__module__):
        return cls(**options)


def make_plan(policy: TrainingPolicy, topology: Topology, job: Job,
              context: PlanningContext) -> Plan:
    """Ask a policy for its plan and dry-run it; a policy's crash is reported by its name.
    Callers normally go through testbed.experiments.planning, which supplies the
    simulator."""
    with plugin_code(f"policy {policy.name!r} failed while planning", type(policy).__module__):
        plan = policy.plan(topology, job, context)
    if not isinstance(plan, Plan):
        raise PluginError(f"policy {policy.name!r} returned {type(plan).__name__}, not a Plan")
    validate_plan(plan, topology, context.host_limits)
    return plan


class Planner(Protocol):
    """What makes a policy's plan for a part below the simulator that plans again (a replan
    after a failure, testbed.run.segments; a launch's rank order): handed to it by its
    caller (testbed.experiments.planning.plan_with_simulator, which supplies the
    simulator), so that it never imports the simulator."""

    def __call__(self, policy: TrainingPolicy, topology: Topology, job: Job) -> Plan: ...
