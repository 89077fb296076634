"""Topology values changed without editing the file: `--set wan.bandwidth=10Gbit` and
`sweep --vary` go through here, so a knob means the same whichever flag turns it.

Keys: `wan.KEY` (every WAN link), `wan.A-B.KEY` (the link between A and B), `tcp.KEY` (the
topology's TCP settings), `dc.KEY` (every datacenter), `dc.NAME.KEY` (one), and `dcs` (the
first N datacenters in file order and the links among them). A value is read as the file
would read it, and checked by the same parser: a bad one is named by its knob.
"""

from __future__ import annotations

from testbed.common.codec import JsonObject, raw
from testbed.common.units import plural
from testbed.common.yamlio import parse_yaml
from testbed.errors import InputError, did_you_mean
from testbed.topology.load import DATACENTER_KEYS, LINK_KEYS, dump_topology, parse_topology
from testbed.topology.model import Topology

SECTIONS = ("wan", "tcp", "dc", "dcs")
"""First parts of the keys that are the topology's, not the job's."""
TCP_KEYS = ("congestion", "rmem", "wmem", "slow_start_after_idle")
EXAMPLES = "wan.latency, wan.bandwidth, wan.A-B.latency, tcp.wmem, dc.gpus, dcs"


def is_topology_key(key: str) -> bool:
    return key.split(".")[0] in SECTIONS


def override(topology: Topology, key: str, value: str, flag: str = "--set") -> Topology:
    """The topology with `key` set to `value` (text, as a flag gives it); an InputError
    located at `flag` and `key` when either is bad."""
    data = raw(dump_topology(topology))
    if key == "dcs":
        data = _first_dcs(data, _count(value, len(topology.datacenters), flag, key))
    else:
        targets = _targets(data, key, flag)
        try:
            parsed = parse_yaml(value, flag) if value.strip() else None
        except InputError as exc:
            raise InputError(exc.problem, flag, key) from None
        for node, field in targets:
            node[field] = parsed
    try:
        return parse_topology(data, topology.source, topology.name)
    except InputError as exc:
        raise InputError(exc.problem, flag, key) from None


def first_dcs(topology: Topology, count: int) -> Topology:
    """The first `count` datacenters in file order and the links among them."""
    return override(topology, "dcs", str(count))


def _count(value: str, have: int, flag: str, key: str) -> int:
    try:
        count = int(value)
    except ValueError:
        count = 0
    if not 1 <= count <= have:
        raise InputError(f"expected a whole number from 1 to {have} (the topology has "
                         f"{plural(have, 'datacenter')}), got {value!r}", flag, key)
    return count


def _first_dcs(data: JsonObject, count: int) -> JsonObject:
    """`data`, a topology as raw data (dump_topology's, through codec.raw), edited as its
    file would be: the first `count` datacenters and the links among them."""
    keep = {d["name"] for d in data["datacenters"][:count]}
    data["datacenters"] = [d for d in data["datacenters"] if d["name"] in keep]
    data["wan"] = [w for w in data["wan"] if set(w["between"]) <= keep]
    return data


def _targets(data: JsonObject, key: str, flag: str) -> list[tuple[JsonObject, str]]:
    """The mappings of the raw data (and the field in each) that `key` sets."""
    section, _, rest = key.partition(".")
    parts = rest.split(".") if rest else []
    if section == "dcs":
        _known(parts, (), flag, key)
    if section == "tcp":
        _known(parts, TCP_KEYS, flag, key)
        return [(data["tcp"], parts[0])]
    items, names, every = ((data["wan"], [_link_name(w) for w in data["wan"]], LINK_KEYS)
                            if section == "wan" else
                            (data["datacenters"], [d["name"] for d in data["datacenters"]],
                             DATACENTER_KEYS))
    fields = tuple(f for f in every if f not in ("between", "name"))
    if len(parts) == 2:
        name, field = parts
        if section == "wan":
            name = _same_link(name, names)
        if name not in names:
            what = "link" if section == "wan" else "datacenter"
            raise InputError(f"no {what} {parts[0]!r} (the topology's: {', '.join(names)})"
                             f"{did_you_mean(parts[0], names)}", flag, key)
        _known([field], fields, flag, key)
        return [(items[names.index(name)], field)]
    _known(parts, fields, flag, key)
    return [(item, parts[0]) for item in items]


def _known(parts: list[str], fields: tuple[str, ...], flag: str, key: str) -> None:
    if len(parts) != 1 or parts[0] not in fields:
        given = parts[-1] if parts else ""
        settable = f"settable: {', '.join(fields)}; " if fields else ""
        raise InputError(f"unknown key ({settable}examples: {EXAMPLES})"
                         f"{did_you_mean(given, fields)}", flag, key)


def _link_name(link: JsonObject) -> str:
    """A `wan` entry of the raw data, by name as `--set wan.A-B.KEY` gives it."""
    a, b = link["between"]
    return f"{a}-{b}"


def _same_link(name: str, names: list[str]) -> str:
    """`west-east` is the link the file writes as east-west."""
    a, _, b = name.partition("-")
    return f"{b}-{a}" if name not in names and f"{b}-{a}" in names else name
