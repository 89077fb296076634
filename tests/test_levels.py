"""The flow model's kept shares (testbed.sim.levels) against solving every component whole
at every event (testbed.sim.max_min, FluidNetwork.incremental_from past any count): the
same bytes left at any instant and the same arrival times, to float precision, on random
flows over shared links and NICs (messages of one pair weighing differently where the
share noise draws them so), with the events that must leave the kept form (a link's
capacity changes, a round trip changes, windows restart, a flow of a busy pair joins, a
flow crosses two links, a NIC binds), and flows the form keeps: in slow start (paced or
not, pausing as their round's window runs out and joining again as the next opens), held
to their caps, between two NICs alone on a NIC the others cross (within a DC), and
started while their pair's last message's last round is still in flight."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.sim.agenda import Agenda
from testbed.sim.levels import Levels
from testbed.sim.network import FluidNetwork, Pair

from .scripts import script

LINKS = ("wan0", "wan1", "wan2")
Arrival = Callable[[float], None]
NICS = tuple(f"nic{i}" for i in range(6))


@dataclass(frozen=True)
class Start:
    at: float
    nbytes: float
    resources: tuple[str, ...]
    rtt: float
    rtt_bias: float
    window: float
    open_window: bool
    paced: bool
    """In slow start: its round's window spread over part of the round trip (a cap)."""
    pair: int
    """Flows of equal `pair` share one Pair (its weight changes as they start and end)."""
    share: float
    """Times the pair's weight for this message (the share noise, testbed.plan.jitter)."""
    then: float = 0.0
    """Bytes of the pair's next message, started as this one arrives: while this one's
    last round is still in flight (0: none)."""


@dataclass(frozen=True)
class Case:
    capacity: dict[str, float]
    starts: tuple[Start, ...]
    changes: tuple[tuple[float, str, str, float], ...]
    """(time, kind: capacity | restart | retime, resource or pair index, value)."""
    probes: tuple[float, ...]


@st.composite
def _cases(draw: st.DrawFn) -> Case:
    # each case has the kept form, or some flows or NICs that break it
    two_links, slow, small_nics, busy_pairs, local = (draw(st.booleans()) for _ in range(5))
    capacity = {r: draw(st.sampled_from([1e9, 2e9]) | st.floats(1e8, 1e10)) for r in LINKS}
    capacity |= {r: draw(st.sampled_from([1e10, 5e8]) | st.floats(1e8, 1e11)) if small_nics
                 else 1e10 for r in NICS}
    starts = []
    for i in range(draw(st.integers(2, 40))):
        links = draw(st.sampled_from([1] * 9 + [2])) if two_links else 1
        if local and draw(st.booleans()):
            links = 0  # between two hosts' NICs alone (within a DC)
        route = (draw(st.sampled_from(NICS)),
                 *draw(st.lists(st.sampled_from(LINKS), min_size=links, max_size=links,
                                unique=True)),
                 draw(st.sampled_from(NICS)))
        starts.append(Start(
            draw(st.sampled_from([0.0, 0.5]) | st.floats(0.0, 1.0)),
            draw(st.floats(1e4, 5e7)), tuple(dict.fromkeys(route)),
            draw(st.sampled_from([0.02, 0.04, 0.06]) | st.floats(1e-4, 0.2)),
            draw(st.sampled_from([0.0, 0.4, 1.0])),
            draw(st.sampled_from([4e6, 4e6, 4e6, 2e5])),
            draw(st.sampled_from([True, False])) if slow else True,
            draw(st.booleans()) if slow else False,
            draw(st.integers(0, 30)) if busy_pairs else i,
            draw(st.sampled_from([1.0, 1.0, 0.7, 1.3])),
            draw(st.sampled_from([0.0, 0.0, 1e5, 3e6]))))
    changes = tuple(
        (draw(st.floats(0.0, 2.0)), kind,
         draw(st.sampled_from(LINKS + NICS)) if kind != "retime" else str(draw(
             st.integers(0, len(starts) - 1))),
         draw(st.floats(1e8, 2e9)) if kind == "capacity" else draw(st.floats(1e-3, 0.1)))
        for kind in draw(st.lists(st.sampled_from(["capacity", "restart", "retime"]),
                                  max_size=3)))
    probes = tuple(draw(st.lists(st.floats(0.0, 3.0), max_size=4)))
    return Case(capacity, tuple(starts), changes, probes)


def _run(case: Case, incremental_from: int
         ) -> tuple[dict[int, float], list[dict[int, float]], int]:
    """Each flow's arrival time (a start's next message under its index plus the number
    of starts), the bytes left at each probe, and how many flows ended while their
    shares were kept."""
    agenda = Agenda()
    network = FluidNetwork(dict(case.capacity), agenda.at, incremental_from=incremental_from)
    pairs: dict[int, Pair] = {}
    arrived: dict[int, float] = {}
    probes: list[dict[int, float]] = []
    kept = [0]
    link_end = network._link_end

    def counted(now: float, levels: Levels, link: str, version: int) -> None:
        kept[0] += network._kept.get(link) is levels and levels.version(link) == version
        link_end(now, levels, link, version)

    network._link_end = counted  # type: ignore[method-assign]
    for i, start in enumerate(case.starts):
        pair = pairs.setdefault(start.pair, Pair(1, start.window, start.rtt, False,
                                                 paced=start.paced, rtt_bias=start.rtt_bias))
        if start.open_window:
            pair.cwnd = start.window

        def then(t: float, start: Start = start, pair: Pair = pair, i: int = i) -> None:
            arrived[i] = t
            if start.then:
                network.start(t, start.then, start.resources, pair, 0.0,
                              lambda end: arrived.__setitem__(i + len(case.starts), end),
                              share=start.share)

        def go(t: float, start: Start = start, pair: Pair = pair, then: Arrival = then
               ) -> None:
            network.start(t, start.nbytes, start.resources, pair, 0.0, then,
                          share=start.share)
        agenda.at(start.at, go)
    for at, kind, what, value in case.changes:
        if kind == "capacity":
            agenda.at(at, lambda t, r=what, v=value: network.set_capacity(t, r, v))
        elif kind == "restart":
            agenda.at(at, lambda t, r=what: network.restart_windows(t, r))
        else:
            pair = pairs[case.starts[int(what)].pair]
            agenda.at(at, lambda t, p=pair, v=value: network.retime(t, p, v))
    for at in case.probes:
        agenda.at(at, lambda t: probes.append(network.remaining(t)))
    agenda.run()
    return arrived, probes, kept[0]


@settings(max_examples=300, deadline=None)
@given(case=_cases())
def test_kept_shares_give_the_whole_solves_bytes_and_times(case: Case) -> None:
    arrived, probes, _ = _run(case, 1)
    reference, reference_probes, kept = _run(case, 10**9)
    assert kept == 0
    assert arrived.keys() == reference.keys() == set(range(len(case.starts))) | {
        len(case.starts) + i for i, start in enumerate(case.starts) if start.then}
    for i, end in reference.items():
        assert arrived[i] == pytest.approx(end, rel=1e-9, abs=1e-9), i
    for probe, expected in zip(probes, reference_probes, strict=True):
        assert probe.keys() == expected.keys()
        for fid, left in expected.items():
            assert probe[fid] == pytest.approx(left, rel=1e-9, abs=1e-3), fid


def test_a_flow_of_the_same_pair_on_other_links_halves_the_others_share_of_its_window(
        ) -> None:
    """Two flows of one pair start together over different links: each may take half the
    pair's window per round trip. Solving every component whole gave the first the whole
    window (the second's start re-solved only the second's links); kept shares gave it
    half (a case Hypothesis found)."""
    capacity = {**dict.fromkeys(LINKS, 1e9), **dict.fromkeys(NICS, 1e10)}

    def start(at: float, nbytes: float, resources: tuple[str, ...]) -> Start:
        return Start(at, nbytes, resources, 0.02, 0.0, 4e6, True, False, 0, 1.0)

    case = Case(capacity, (start(0.0, 1e4, ("nic0", "wan0")), start(0.0, 10001.0, ("nic0", "wan0")),
                           start(1.0, 1e4, ("nic0", "wan0")), start(1.0, 1e4, ("nic1", "wan1"))),
                (), ())
    half_window = 4e6 * 8 / 0.02 / 2  # bit/s
    for incremental_from in (1, 10**9):
        arrived, _, _ = _run(case, incremental_from)
        assert arrived[2] == arrived[3] == pytest.approx(1.0 + 1e4 * 8 / half_window)


@pytest.mark.parametrize("changes", [
    (), ((8.0, "capacity", "wan:0>1", 5e8), (9.0, "retime", "3", 0.05),
         (12.0, "restart", "wan:2>3", 0.0), (15.0, "capacity", "up:1-7", 2e7))])
def test_many_flows_end_through_kept_shares_at_the_whole_solves_times(
        changes: tuple[tuple[float, str, str, float], ...]) -> None:
    """The simulator's scale benchmark (scripts/peer_cases.scale_job) at 600 flows: past
    the default count most flows end through kept shares, at the times solving every
    component whole gives; also where a link's capacity, a round trip and windows change
    (the shares are solved whole, then kept again) and a NIC binds."""
    job = script("peer_cases").scale_job(600)
    starts = tuple(Start(f.start, f.nbytes, f.route, f.rtt, 0.4, 4e6, True, False, i, 1.0)
                   for i, f in enumerate(job.flows))
    case = Case(dict(job.capacity), starts, changes, (5.0, 8.0, 9.5, 20.0))
    arrived, probes, kept = _run(case, FluidNetwork.incremental_from)
    reference, reference_probes, _ = _run(case, 10**9)
    assert kept > 200
    assert arrived == pytest.approx(reference, rel=1e-9)
    for probe, expected in zip(probes, reference_probes, strict=True):
        assert probe == pytest.approx(expected, rel=1e-9, abs=1e-3)


def test_a_flow_alone_on_a_resource_the_kept_shares_no_longer_use_meets_none() -> None:
    """A flow whose round trip changed shares with its new weight from the end of that
    instant; a flow that starts later on a NIC only an ended flow of that
    component crossed is alone there and solves nothing, with the shares kept or not (the
    kept ones let go of that NIC, as the whole solve never saw it coupled)."""
    capacity = {**dict.fromkeys(LINKS, 1e9), **dict.fromkeys(NICS, 1e10)}

    def start(at: float, nbytes: float, resources: tuple[str, ...], pair: int) -> Start:
        return Start(at, nbytes, resources, 0.02, 1.0, 4e6, True, False, pair, 1.0)

    case = Case(capacity, (start(0.0, 4e7, ("nic0", "wan0"), 0),
                           start(0.0, 3e7, ("nic0", "wan0"), 1),
                           start(0.0, 1e4, ("nic1", "wan0"), 2),
                           start(0.2, 1e4, ("nic1", "wan1"), 3)),
                ((0.1, "retime", "0", 0.05),), ())
    reference, _, _ = _run(case, 10**9)
    arrived, _, kept = _run(case, 1)
    assert kept > 0
    assert arrived == pytest.approx(reference, rel=1e-9)


def test_a_flow_kept_on_resources_a_link_of_its_shares_used_ends_at_its_own_time() -> None:
    """A slow-start flow paused off a kept link (wan0) whose other flows have all ended
    joins again, as the next round opens, as a dependent on that link's resources. An end
    event still pending from the link's time must not end it: the dependent's version and
    the link's came from separate counts and matched, so it ended 0.09 of its last byte
    in (a case Hypothesis found)."""
    capacity = {"wan0": 1e8, "wan1": 1e9, "wan2": 1e9, "nic0": 5e8,
                **{nic: 1e10 for nic in NICS[1:]}}

    def start(at: float, nbytes: float, resources: tuple[str, ...], rtt: float,
              open_window: bool, pair: int) -> Start:
        return Start(at, nbytes, resources, rtt, 0.0, 4e6, open_window, False, pair, 1.0)

    case = Case(capacity, (start(0.012857877102381291, 8389881.0, ("nic0", "wan1"), 0.02,
                                 True, 0),
                           start(0.0, 1e4, ("nic0", "wan0"), 0.02, True, 1),
                           start(0.0, 1e4, ("nic0", "wan0"), 0.02, True, 2),
                           start(0.1161566720890446, 43441.0, ("nic0", "wan0", "nic1"), 0.02,
                                 False, 3),
                           start(0.0, 101361.0, ("nic1", "wan1"), 0.06, False, 4)), (), ())
    reference, _, _ = _run(case, 10**9)
    arrived, _, _ = _run(case, 1)
    # two rounds of slow start leave one byte, which wan0 carries in 80 ns
    assert reference[3] == pytest.approx(0.1161566720890446 + 2 * 0.02 + 8 / (1e8 * 1448 / 1500),
                                         abs=1e-9)
    assert arrived == pytest.approx(reference, rel=1e-12)


@pytest.mark.parametrize("open_window", [True, False])
def test_flows_in_lockstep_are_solved_whole_to_the_bit(open_window: bool) -> None:
    """Replicas' messages of one size started together under equal shares end together:
    their component is solved whole, to the bit as with no kept shares at all (one
    solve serves every end), where drawn shares part them and kept shares take the
    ends."""
    capacity = {**dict.fromkeys(LINKS, 1e9), **dict.fromkeys(NICS, 1e10)}

    def starts(shares: list[float]) -> tuple[Start, ...]:
        return tuple(Start(0.0, 2e7, (f"nic{i % 3}", "wan0", f"nic{3 + i % 3}"), 0.04, 0.0,
                           4e6, open_window, False, i, share)
                     for i, share in enumerate(shares))

    equal = Case(capacity, starts([1.0] * 24), (), (0.3,))
    arrived, probes, kept = _run(equal, FluidNetwork.incremental_from)
    reference, reference_probes, _ = _run(equal, 10**9)
    assert kept == 0
    assert (arrived, probes) == (reference, reference_probes)
    drawn = Case(capacity, starts([1.0 + 0.01 * i for i in range(24)]), (), (0.3,))
    arrived, _, kept = _run(drawn, FluidNetwork.incremental_from)
    reference, _, _ = _run(drawn, 10**9)
    assert kept > 12
    assert arrived == pytest.approx(reference, rel=1e-9)


@pytest.mark.parametrize("rtt_bias", [0.0, 1.0])
def test_a_transfer_within_a_dc_on_a_wan_flows_nic_is_kept_beside_it(rtt_bias: float) -> None:
    """GPT-3's 1F1B in small: replicas' WAN flows with drawn shares, each into a NIC of
    its own, and transfers within the DC into some of those NICs, in slow start with a
    round trip of 10 us. Weighed by their round trip (rtt_bias 1) the transfers outweigh
    the WAN flows thousands of times and the NIC holds each WAN flow it meets; unweighed
    the WAN link does. Either way kept shares give the whole solve's times."""
    capacity = {"wan0": 1e9, **{f"up{i}": 1e11 for i in range(24)},
                **{f"down{i}": 1e11 for i in range(24)}}
    wan = tuple(Start(0.0, 2e7, (f"up{i}", "wan0", f"down{i}"), 0.04, rtt_bias, 4e6, False,
                      False, i, 1.0 + 0.02 * i) for i in range(20))
    local = tuple(Start(0.05 * k, 5e7, (f"up{20 + k}", f"down{3 * k}"), 1e-5, rtt_bias, 4e6,
                        False, False, 20 + k, 1.0) for k in range(4))
    case = Case(capacity, wan + local, (), (0.1, 0.2))
    arrived, probes, kept = _run(case, FluidNetwork.incremental_from)
    reference, reference_probes, _ = _run(case, 10**9)
    assert kept > 20
    assert arrived == pytest.approx(reference, rel=1e-9)
    for probe, expected in zip(probes, reference_probes, strict=True):
        assert probe == pytest.approx(expected, rel=1e-9, abs=1e-3)


@pytest.mark.parametrize("alone", [True, False])
def test_a_round_trip_changed_in_the_instant_a_flow_starts_applies_to_it(alone: bool) -> None:
    """The shares a flow starts with are those solved at the end of its first instant, so
    its pair's round trip changed later in that instant sets its cap (here 4 MB over
    250 ms, 128 Mbit/s), whether it is alone on its links (and takes its rate at once)
    or joins kept shares (which are solved whole again). Both once ended with the old
    cap: alone on a NIC, as a flow on it ended a float's width before (a case Hypothesis
    found)."""
    capacity = {**dict.fromkeys(LINKS, 1e9), **dict.fromkeys(NICS, 1e10)}

    def start(at: float, nbytes: float, resources: tuple[str, ...], pair: int) -> Start:
        return Start(at, nbytes, resources, 0.02, 0.0, 4e6, True, False, pair, 1.0 + pair / 10)

    others = () if alone else tuple(start(0.0, 4e8 * (1 + i), (f"nic{i}", "wan0"), i)
                                    for i in range(3))
    late = start(1.0, 4e6, ("nic5", "wan1") if alone else ("nic4", "wan0"), 3)
    case = Case(capacity, (*others, late), ((1.0, "retime", str(len(others)), 0.25),), ())
    reference, _, _ = _run(case, 10**9)
    arrived, _, kept = _run(case, 1)
    assert arrived == pytest.approx(reference, rel=1e-9)
    assert kept > 0 or alone
    assert reference[len(others)] == pytest.approx(1.0 + 4e6 * 8 / 128e6)


@pytest.mark.parametrize("paced", [False, True])
def test_a_message_started_beside_the_last_ones_tail_is_kept(
        paced: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicas with drawn shares, in slow start all along (buffers of 60 MB), each send
    a second message as their first arrives, while its last round is still in flight:
    the second starts with the window less those bytes and joins the kept shares, at the
    whole solve's times. (Such a pair's component was solved whole at each of its events
    until the bytes landed: some 50 solves here, against a few.)"""
    capacity = {**dict.fromkeys(LINKS, 1e9), **dict.fromkeys(NICS, 1e10)}
    starts = tuple(Start(0.0, 4e6 + 1e5 * i, (f"nic{i % 3}", "wan0", f"nic{3 + i % 3}"), 0.04,
                         0.0, 6e7, False, paced, i, 1.0 + 0.01 * i, then=3e6)
                   for i in range(24))
    case = Case(capacity, starts, (), (0.2, 0.5))
    reference, reference_probes, _ = _run(case, 10**9)
    solves: list[float] = []
    solve = FluidNetwork._solve

    def counted(self: FluidNetwork, now: float, resources: tuple[str, ...]) -> set[str]:
        solves.append(now)
        return solve(self, now, resources)

    monkeypatch.setattr(FluidNetwork, "_solve", counted)
    arrived, probes, kept = _run(case, FluidNetwork.incremental_from)
    assert kept > 24 and len(solves) <= 5
    assert arrived == pytest.approx(reference, rel=1e-9)
    for probe, expected in zip(probes, reference_probes, strict=True):
        assert probe == pytest.approx(expected, rel=1e-9, abs=1e-3)


def test_a_round_trip_changed_while_no_flow_starts_or_ends_applies_at_once() -> None:
    """A flow with a 0.1 ms round trip weighed by it (rtt_bias 1) takes nearly all of a
    100 Mbit/s link from two others; its round trip then becomes 62.5 ms, which caps it
    at 25.6 Mbit/s (its 200 KB window per round trip) and weighs it 625 times less. The
    others get the link back at once: they end near 0.8 s, it near 5.4 s. (Solved whole,
    the change waited for the component's next start or end and they ended near 2.0 s,
    it at 1.9 s; kept shares took it at their next event: a case Hypothesis found.)"""
    capacity = {**dict.fromkeys(LINKS, 1e9), **dict.fromkeys(NICS, 1e10), "wan0": 1e8}
    starts = (Start(0.5, 16893313.0, ("nic0", "wan0"), 1e-4, 1.0, 2e5, False, False, 0, 1.3),
              Start(0.0, 3865855.0, ("nic5", "wan0"), 0.02, 0.0, 4e6, True, False, 1, 1.0),
              Start(0.0, 3536806.0, ("nic0", "wan0"), 1e-4, 0.0, 4e6, False, False, 2, 1.0),
              *(Start(0.0, 1e4, ("nic0", "wan0"), 0.02, 0.0, 4e6, True, False, 3 + i, 1.0)
                for i in range(16)))
    case = Case(capacity, starts, ((0.625, "retime", "0", 0.0625),), ())
    reference, _, _ = _run(case, 10**9)
    arrived, _, _ = _run(case, 1)
    assert arrived == pytest.approx(reference, rel=1e-9)
    assert reference[0] == pytest.approx(5.4, abs=0.1)
    assert reference[1] < 1.0 and reference[2] < 1.0
