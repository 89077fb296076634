"""Finding policy plugins through entry points; built-ins register the same way.

A plugin that fails to import is kept as an entry with its error, so that listing and
every other policy keep working; only choosing it fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from testbed.errors import InputError, PluginError, TestbedError
from testbed.job import Job
from testbed.plan.model import Plan
from testbed.plan.validate import validate_plan
from testbed.policy.base import BubblePolicy, TrainingPolicy
from testbed.topology.model import Topology

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

    @property
    def ok(self) -> bool:
        return self.error is None


def discover(group: str) -> dict[str, PluginInfo]:
    """Every plugin registered under `group`, by name, loaded or with its load error."""
    found: dict[str, PluginInfo] = {}
    for entry in sorted(entry_points(group=group), key=lambda e: e.name):
        info = _load(entry, group)
        if entry.name in found and found[entry.name].distribution != info.distribution:
            other = found[entry.name]
            found[entry.name] = PluginInfo(
                entry.name,
                group,
                info.target,
                f"{other.distribution}, {info.distribution}",
                error=f"registered by both {other.distribution} and {info.distribution}",
            )
            continue
        found[entry.name] = info
    return found


def _load(entry: EntryPoint, group: str) -> PluginInfo:
    dist = entry.dist.name if entry.dist is not None else "unknown"
    try:
        obj = entry.load()
    except Exception as exc:  # a broken plugin must not break the CLI
        return PluginInfo(
            entry.name, group, entry.value, dist, error=f"{type(exc).__name__}: {exc}"
        )
    base = _BASES[group]
    if not (isinstance(obj, type) and issubclass(obj, base)):
        return PluginInfo(
            entry.name,
            group,
            entry.value,
            dist,
            error=f"{entry.value} is not a subclass of {base.__name__}",
        )
    registered_as = getattr(obj, "name", None)
    if registered_as != entry.name:
        return PluginInfo(
            entry.name,
            group,
            entry.value,
            dist,
            error=f"{entry.value}.name is {registered_as!r}, registered as {entry.name!r}",
        )
    return PluginInfo(entry.name, group, entry.value, dist, cls=obj)


def _pick(group: str, name: str, what: str) -> type[Any]:
    plugins = discover(group)
    info = plugins.get(name)
    if info is None:
        usable = ", ".join(n for n, p in plugins.items() if p.ok) or "none"
        raise InputError(f"unknown {what} {name!r} (installed: {usable}; see `testbed plugins`)")
    if info.cls is None:
        raise PluginError(f"{what} {name!r} from {info.distribution} is broken: {info.error}")
    return info.cls


def training_policy(name: str, options: dict[str, str] | None = None) -> TrainingPolicy:
    cls = _pick(TRAINING_GROUP, name, "training policy")
    policy: TrainingPolicy = _construct(cls, name, options or {})
    return policy


def bubble_policy(name: str, options: dict[str, str] | None = None) -> BubblePolicy:
    cls = _pick(BUBBLE_GROUP, name, "bubble policy")
    policy: BubblePolicy = _construct(cls, name, options or {})
    return policy


def _construct(cls: type[Any], name: str, options: dict[str, str]) -> Any:
    try:
        instance = cls(**options)
    except TestbedError:
        raise
    except Exception as exc:
        raise PluginError(f"policy {name!r} failed to start: {type(exc).__name__}: {exc}") from None
    return instance


def make_plan(policy: TrainingPolicy, topology: Topology, job: Job) -> Plan:
    """Ask a policy for its plan and dry-run it; a policy's crash is reported by its name."""
    try:
        plan = policy.plan(topology, job)
    except TestbedError:
        raise
    except Exception as exc:
        raise PluginError(
            f"policy {policy.name!r} failed while planning: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(plan, Plan):
        raise PluginError(f"policy {policy.name!r} returned {type(plan).__name__}, not a Plan")
    validate_plan(plan, topology)
    return plan
