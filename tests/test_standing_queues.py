"""Standing queues (testbed.sim.queues): flows a link holds back keep what their round trip
does not hold of their window waiting in its queue, and every other flow through it, data
or acknowledgements, waits there too."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.plan.pacing import PACING_SHARE
from testbed.plan.tcp_model import PAYLOAD_EFFICIENCY, STANDING_QUEUE, loss_response
from testbed.policy.registry import training_policy
from testbed.sim.agenda import Agenda
from testbed.sim.flows import Pair
from testbed.sim.network import FluidNetwork
from testbed.sim.queues import StandingQueues, reverse
from testbed.sim.simulate import simulated_iteration_s

ROOT = Path(__file__).resolve().parent.parent
RATE = 500e6
WINDOW = 2.98e6
SHORT, LONG = 0.01, 0.09
DEEP, SHALLOW = 5.625e6, 625e3
BIG = 1e12


def _steady(rtt: float, congestion: str = "cubic", pacing_bps: float = math.inf) -> Pair:
    """One connection whose window is already open to its buffers' limit."""
    pair = Pair(1, WINDOW, rtt, False, response=loss_response(congestion),
                pacing_bps=pacing_bps)
    pair.cwnd, pair.last_active = WINDOW, 0.0
    return pair


def _rates(queue: float | None, congestion: str = "cubic", short_bytes: float = BIG,
           at: float = 1.0, shorts: int = 1, pacing_bps: float = math.inf
           ) -> tuple[float, float, Pair]:
    """`shorts` short flows h->x that their link holds back (pairs of their own), a long
    one x->h whose acknowledgements come back over h->x: the first short one's rate and
    the long one's at `at`, and the long one's pair."""
    agenda = Agenda()
    queues = {} if queue is None else {"wan:h>x": queue, "wan:x>h": queue}
    network = FluidNetwork({"wan:h>x": RATE, "wan:x>h": RATE}, agenda.at,
                           queues=StandingQueues(queues))
    long = _steady(LONG)
    seen: list[list[float]] = []
    agenda.at(0.0, lambda t: network.start(t, BIG, ("wan:x>h",), long, LONG / 2,
                                           lambda _t: None))
    for _ in range(shorts):
        short = _steady(SHORT, congestion, pacing_bps)
        agenda.at(0.0, lambda t, short=short: network.start(
            t, short_bytes, ("wan:h>x",), short, SHORT / 2, lambda _t: None))
    agenda.at(at, lambda t: seen.append(
        [f.rate for f in sorted(network.flows.values(), key=lambda f: f.id)]))
    agenda.stop_after = at
    agenda.run()
    rates = seen[0]
    return (rates[1] if len(rates) > 1 else 0.0), rates[0], long


def test_a_window_limited_flow_waits_in_the_queue_a_shorter_flow_keeps_standing() -> None:
    short_rate, long_rate, _ = _rates(DEEP)
    link = RATE * PAYLOAD_EFFICIENCY
    assert short_rate == pytest.approx(link)  # held by its share, not slowed by its queue
    waiting = (WINDOW - link / 8 * SHORT) * 8 / link
    assert long_rate == pytest.approx(WINDOW * 8 / (LONG + waiting))
    assert long_rate < 0.75 * WINDOW * 8 / LONG


def test_a_queue_the_windows_overflow_cuts_them_and_stands_less() -> None:
    """The short flow's window outgrows the shallow queue: it loses a packet there with its
    share of what the link holds in flight (its rate times its round trip and the full
    queue's wait), keeps CUBIC's 0.7 of that as its threshold, and the queue it keeps
    standing after is less than the half of itself an uncut window would keep."""
    agenda = Agenda()
    queues = StandingQueues({"wan:h>x": SHALLOW, "wan:x>h": SHALLOW})
    network = FluidNetwork({"wan:h>x": RATE, "wan:x>h": RATE}, agenda.at, queues=queues)
    short = _steady(SHORT)
    agenda.at(0.0, lambda t: network.start(t, BIG, ("wan:h>x",), short, SHORT / 2,
                                           lambda _t: None))
    agenda.stop_after = 0.5
    agenda.run()
    link = RATE * PAYLOAD_EFFICIENCY
    held = link / 8 * (SHORT + SHALLOW * 8 / link)
    assert short.w_max == pytest.approx(held)
    assert short.ssthresh == pytest.approx(0.7 * held)
    _, long_rate, _ = _rates(SHALLOW)
    half = STANDING_QUEUE * SHALLOW * 8 / link
    assert WINDOW * 8 / (LONG + half) < long_rate < WINDOW * 8 / LONG


def test_a_loss_cuts_a_pair_once_a_round_trip_and_never_bbr() -> None:
    cubic, bbr = _steady(SHORT), _steady(SHORT, "bbr")
    assert cubic.cut(1.0, 1e6) and cubic.cwnd == pytest.approx(0.7e6)
    assert not cubic.cut(1.0 + SHORT / 2, 0.5e6)  # within its recovery's round trip
    assert cubic.cut(1.0 + SHORT, 0.5e6)  # a lower W_max: fast convergence lowers it more
    assert cubic.w_max == pytest.approx(0.5e6 * 1.7 / 2)
    assert cubic.ssthresh == pytest.approx(0.35e6)
    assert not bbr.cut(1.0, 1e6) and bbr.ssthresh == math.inf


def test_no_queue_given_or_bbr_holding_the_link_leaves_the_round_trip_as_it_is() -> None:
    for queue, congestion in ((None, "cubic"), (DEEP, "bbr")):
        _, long_rate, pair = _rates(queue, congestion)
        assert long_rate == pytest.approx(WINDOW * 8 / LONG)
        assert pair.rtt == LONG


def test_one_paced_pair_keeps_no_queue_two_do() -> None:
    """Paced below the link's rate (testbed.plan.pacing), one pair alone cannot keep its
    queue standing, whatever its window; two together can."""
    paced = PACING_SHARE * RATE
    _, alone, pair = _rates(DEEP, pacing_bps=paced)
    assert (alone, pair.queued_s) == (pytest.approx(WINDOW * 8 / LONG), 0.0)
    short_rate, together, _ = _rates(DEEP, shorts=2, pacing_bps=paced)
    link = RATE * PAYLOAD_EFFICIENCY
    waiting = 2 * (WINDOW - link / 2 / 8 * SHORT) * 8 / link
    assert short_rate == pytest.approx(link / 2)
    assert together == pytest.approx(WINDOW * 8 / (LONG + waiting))


def test_the_queue_drains_when_the_flow_keeping_it_ends() -> None:
    _, long_rate, pair = _rates(DEEP, short_bytes=50e6, at=3.0)
    assert (pair.rtt, pair.queued_s) == (LONG, 0.0)
    assert long_rate == pytest.approx(WINDOW * 8 / LONG)


def test_acknowledgements_come_back_the_other_way() -> None:
    assert reverse("wan:h>x") == "wan:x>h"


def test_a_detour_behind_a_deep_queue_is_slower_than_over_direct_links() -> None:
    """detour-3dc-deep: x's flows to y get their acknowledgements through h->x, which h's
    activations keep standing; the same round trips over direct links wait in no queue
    (the fidelity table, docs/simulator.md, has both against the emulator)."""
    times = []
    for name in ("detour-3dc-deep", "detour-3dc-direct"):
        inputs = load_inputs(ROOT / "scripts" / "fidelity_topologies" / f"{name}.yaml",
                             sets=("iterations=2",))
        policy = training_policy("gpipe")
        plan = plan_with_simulator(policy, inputs.topology, inputs.job)
        times.append(simulated_iteration_s(inputs.topology, inputs.job, plan, policy))
    deep, direct = times
    assert deep is not None and direct is not None
    assert deep > 1.1 * direct
