"""What TCP delivers of a link, as the simulator models it; in one neutral place so that
policies estimating transfer times use the very figures the simulator runs on."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from testbed.topology.model import TcpSettings

MSS = 1448
PAYLOAD_EFFICIENCY = MSS / 1500
"""TCP payload per byte a link carries (the shapers count IP bytes)."""
WINDOW_EFFICIENCY = 0.71
"""Share of tcp_wmem's maximum one connection of the workers' transport keeps in flight:
the send buffer, not the congestion or the receiver's window, limits it, and the writer
does not keep it full. Measured on this kernel with `ss -tin` on the sender of 200 MB over
one connection with a 4 MiB buffer, once its window stopped growing: a median of 2,070
segments unacknowledged at 50 and 100 ms RTT (scripts/bench_peers.py --emulator
inflight, benchmarks/peers.json). iperf3, which writes differently, keeps 0.85 (0.287
Gbit/s at 100 ms, scripts/bench_net.py)."""
RECEIVE_WINDOW_EFFICIENCY = 0.657
"""Share of tcp_rmem's maximum the receiver advertises once autotuning has grown its
buffer (the kernel's scaling ratio of payload to buffer memory): 4,133,888 bytes of a 6 MiB
`tcp_rmem` in the same measurement."""


WINDOW_EFFICIENCY_BY_RATE: tuple[tuple[float, float], ...] = (
    (1e9, WINDOW_EFFICIENCY), (2e9, 0.81), (4e9, 0.88), (1e10, 0.91))
"""WINDOW_EFFICIENCY by the path's bottleneck rate (bit/s): a window-limited connection
keeps more of its send buffer in flight where the bottleneck is faster. Measured as
WINDOW_EFFICIENCY's figure and in one recording at these rates (scripts/bench_peers.py
--emulator windows: 200 MB over one connection with a 4 MiB buffer at a 40 ms round trip,
its steady goodput times the round trip): 0.70 of the buffer per round trip at 1 Gbit/s,
0.80 at 2, 0.86 at 4 and 0.89 at 10; each point above 1 Gbit/s is WINDOW_EFFICIENCY times
its goodput's ratio to the 1 Gbit/s one of the same recording (tests/test_tcp_model.py
holds them to it). In the same runs (`ss -tin`), at 1 Gbit/s the sender held data queued,
not sent, and 1,980 segments unacknowledged; at 10 Gbit/s about 2,880, up to the
receiver's window. Likely, not shown: the slower bottleneck spaces the acknowledgements
over most of the round trip, and the transport's writer refills the buffer in steps."""


def window_efficiency(bottleneck_bps: float | None = None) -> float:
    """WINDOW_EFFICIENCY_BY_RATE at a rate: between its points linear in the rate's
    logarithm, beyond them its first or last figure (and the first where the rate is not
    given: WINDOW_EFFICIENCY)."""
    points = WINDOW_EFFICIENCY_BY_RATE
    if bottleneck_bps is None or bottleneck_bps <= points[0][0]:
        return points[0][1]
    for (low, at_low), (high, at_high) in itertools.pairwise(points):
        if bottleneck_bps <= high:
            share = math.log(bottleneck_bps / low) / math.log(high / low)
            return at_low + share * (at_high - at_low)
    return points[-1][1]


def in_flight_bytes(sender: TcpSettings, receiver: TcpSettings,
                    bottleneck_bps: float | None = None) -> float:
    """The most one connection keeps in flight: its share of the sender's buffer on a path
    whose bottleneck is `bottleneck_bps` (window_efficiency) or the window the receiver
    advertises, whichever is smaller."""
    return min(window_efficiency(bottleneck_bps) * sender.wmem[2],
               RECEIVE_WINDOW_EFFICIENCY * receiver.rmem[2])


def in_flight_under_loss(window: float, loss: float) -> float:
    """What one connection keeps in flight at most on a path that loses `loss` of its
    packets, once it has lost one, where its buffers alone let it keep `window`
    (in_flight_bytes). A hole holds back every byte sent after it: the sender frees a
    byte's memory only once the cumulative acknowledgement passes it
    (tcp_clean_rtx_queue), and the receiver's window
    runs from the first byte it lacks (RFC 9293), so the bytes sent within a round trip
    after a lost one stay in both buffers, acknowledged selectively or not, until its
    repair is acknowledged, two round trips after the loss's send (RACK, RFC 8985) rather
    than one. Over the packets of the round trip before a byte, the latest loss falls at
    random (losses a Poisson process at rate `loss` per packet): a byte sent d packets
    after it waits 2 - d/n round trips for n packets a round trip, so a byte waits
    h(x) = 2 - (1 - e^-x)/x round trips on average, x = loss * n, and by Little's law the
    buffers keep window / h(x) in flight: n is the fixed point. A clean path keeps
    `window`. Against a packet-level draw of such a sender (tests/test_tcp_model.py) it
    is up to a tenth high, where x is about 1: sends after a repair come in bursts, not
    evenly over the round trip as the closed form takes them."""
    if loss <= 0.0:
        return window
    packets = window / MSS
    for _ in range(HOLD_ITERATIONS):
        x = loss * packets
        held = window / MSS / (2.0 + math.expm1(-x) / x)
        if abs(held - packets) <= 1e-9 * packets:
            break
        packets = held
    return held * MSS


HOLD_ITERATIONS = 200
"""The fixed point of in_flight_under_loss contracts (by a factor of at most 0.2 a step):
a few dozen steps reach it to the float."""


RESERVED_FILES = 64
"""Open files a worker keeps for everything but its pipeline connections."""


@dataclass(frozen=True)
class HostLimits:
    """What a host lets one worker's connections use. The defaults are Linux's own where it
    has one: a process may raise its open-file limit to the hard RLIMIT_NOFILE (4096 unless
    configured); TCP memory (`net.ipv4.tcp_mem`) scales with the host's RAM, so it has no
    default and does not bound unless given."""

    open_files: int = 4096
    """Open files a worker may hold (the hard RLIMIT_NOFILE): each connection is one."""
    tcp_memory_bytes: int | None = None
    """Where `net.ipv4.tcp_mem` puts TCP under memory pressure (its middle value)."""

    def connections_per_peer(self, send_buffer_bytes: int, peers: int = 2) -> int:
        """Most connections to each of `peers` neighbours: each is one open file, and each
        can fill its send buffer (receive buffers drain: the worker always reads)."""
        by_files = (self.open_files - RESERVED_FILES) // peers
        if self.tcp_memory_bytes is None:
            return max(1, by_files)
        by_memory = self.tcp_memory_bytes // (peers * max(1, send_buffer_bytes))
        return max(1, min(by_files, by_memory))

    def describe(self, send_buffer_bytes: int) -> str:
        """What sets `connections_per_peer`, in words."""
        files = f"an open-file limit of {self.open_files:,}"
        if self.tcp_memory_bytes is None:
            return files
        return (f"{files}, TCP memory under pressure past {self.tcp_memory_bytes:,} bytes "
                f"with send buffers of {send_buffer_bytes:,}")


RTT_BIAS: dict[tuple[str, bool], float] = {
    ("cubic", False): 0.79, ("cubic", True): 0.69,
    ("bbr", False): 0.01, ("bbr", True): -0.01,
    ("reno", False): 1.08, ("reno", True): 1.04,
}
"""Flows of different round trips sharing a bottleneck get shares that go as RTT^-a, a
per congestion control and pacing, each round trip with the bottleneck's standing queue
in it (STANDING_QUEUE): fitted on all share runs of
benchmarks/peers-emulator.json (the emulator's real Linux TCP on a quiet machine: one flow
each of 20 and 100 ms, and eight of 10-200 ms, sharing 200 Mbit/s, five runs of iperf3
each, unpaced and paced as the plan paces, each over several congestion epochs of its
slowest flow where that fits in a minute: 60 s for CUBIC and BBR, 15 s for Reno, whose
epochs at 100 ms take about 40 s; scripts/peer_emulator.py's SHARE_WINDOWS) by
scripts/rtt_bias_fit.py (`fit_rtt_bias`:
least squares on log(simulated / median share) over the two and eight flows together;
tests/test_tcp_model.py holds these constants to that fit). Mathis et al. 1997 give 1 for
Reno at a common loss rate, as the emulator's Reno does; CUBIC is biased less (its window
grows in real time, RFC 8312), and BBR, whose rate follows its estimate of the
bottleneck's bandwidth, not a window grown per round trip, hardly at all."""


STANDING_QUEUE = 0.5
"""The share of a bottleneck's drop-tail queue that flows sharing it find there on
average, counted in each one's round trip for its RTT bias (testbed.sim.flows.Pair.weight):
every flow through a bottleneck waits in its queue, so a deep queue narrows the ratio of
their round trips (Dordal, "An Introduction to Computer Networks", 20.3, TCP fairness
with different RTTs). Loss-based flows fill it to a loss, halve or cut back, and fill it
again: about half full on average, taken as is, not fitted (so does testbed.sim.queues
where the windows a link holds back overflow its queue). Held out of RTT_BIAS's fit,
two CUBIC flows of 20 and 100 ms behind a queue of 100 ms (benchmarks/peers.json,
held_out_shares) agree within 4%; behind one of 50 ms, recorded afterwards to check it,
they are biased about as little, and the model's figures are 11-22% off."""


def rtt_bias(congestion: str, paced: bool) -> float:
    return RTT_BIAS.get((congestion, paced), 0.0)


KEEPS_WINDOW_AFTER_IDLE = frozenset({"bbr"})
"""Congestion controls whose window `tcp_slow_start_after_idle` leaves alone: Linux
restarts an idle connection's window (tcp_cwnd_restart) only where the congestion
control has no `cong_control` hook of its own (tcp_slow_start_after_idle_check in
net/ipv4/tcp_output.c returns early for one); BBR has one, and after an idle it sends on
at its model of the bottleneck's bandwidth. Measured: rounds of two messages of 21 MB
after an idle of over a second on 1 Gbit/s, 40 ms, take BBR 0.36 s in the emulator (the
link's rate); the model, restarting the window, gave 0.56 s (benchmarks/peers.json,
bursts)."""


def restarts_after_idle(congestion: str, slow_start_after_idle: bool) -> bool:
    """Whether an idle connection's window restarts (halving per RTO idle down to the
    initial window) before it sends again."""
    return slow_start_after_idle and congestion not in KEEPS_WINDOW_AFTER_IDLE


RESTART_THRESHOLD = 0.75
"""A restart after idle keeps the slow-start threshold at least this share of the window
the connection had (tcp_cwnd_restart takes tcp_current_ssthresh: the larger of the
threshold and three quarters of the window)."""


@dataclass(frozen=True)
class LossResponse:
    """How a loss-based congestion control's window answers a loss and grows back
    (per connection, bytes): Reno (RFC 5681: halve, then one segment per round trip) or
    CUBIC (RFC 8312: 0.7 of the window, then W(t) = C (t - K)^3 + W_max with C = 0.4, or
    its Reno-friendly estimate where that is larger)."""

    kind: str
    beta: float

    def window_after(self, since_loss_s: float, rtt_s: float, w_max: float) -> float:
        """The window one round trip on from `since_loss_s` after a loss at `w_max`."""
        w_max_segments = w_max / MSS
        reno = w_max_segments * self.beta + (
            RENO_FRIENDLY_ALPHA * since_loss_s / rtt_s if self.kind == "cubic"
            else since_loss_s / rtt_s)
        if self.kind != "cubic":
            return reno * MSS
        k = float((w_max_segments * (1 - self.beta) / CUBIC_C) ** (1 / 3))
        cubic = CUBIC_C * (since_loss_s + rtt_s - k) ** 3 + w_max_segments
        return max(cubic, reno) * MSS


CUBIC_C = 0.4
RENO_FRIENDLY_ALPHA = 3 * (1 - 0.7) / (1 + 0.7)
"""RFC 8312's additive increase per round trip that makes CUBIC as fast as Reno."""
LOSS_RESPONSES = {"cubic": LossResponse("cubic", 0.7), "reno": LossResponse("reno", 0.5),
                  "bbr": LossResponse("bbr", 1.0)}
"""BBR (v1, Linux's tcp_bbr.c) keeps its window at a loss, but its first round of
recovery conserves packets (the window held at what is in flight: no growth that round,
Cardwell et al. 2016); beta 1 says so."""


def loss_response(congestion: str) -> LossResponse | None:
    return LOSS_RESPONSES.get(congestion)


def cuts_at_loss(response: LossResponse | None) -> bool:
    """Whether the congestion control shrinks its window at a loss (Reno, CUBIC), so that
    its connections saw between losses; BBR keeps its window."""
    return response is not None and response.beta < 1.0


def sawtooth_cv(congestion: str) -> float:
    """How unequal the windows of equal loss-based connections are at any moment: the
    coefficient of variation of one connection's window over its loss cycle, each cycle
    at a phase of its own. Reno climbs linearly from beta W to W (uniform:
    (1 - beta) / (sqrt(3) (1 + beta)), 19% at beta 0.5); CUBIC approaches W as
    W - C (K - t)^3 (RFC 8312), so over t uniform in [0, K] its window is
    W (1 - (1 - beta) x^3) for x uniform in [0, 1]: (1 - beta) sqrt(9/112) /
    (1 - (1 - beta) / 4), 9.2% at beta 0.7. BBR has no sawtooth: 0. The share noise
    (`--jitter share=CV`) this suggests: equal flows of a congestion control that meet at
    a bottleneck do not get equal shares."""
    response = loss_response(congestion)
    if response is None or not cuts_at_loss(response):
        return 0.0
    drop = 1.0 - response.beta
    if response.kind == "cubic":
        return drop * math.sqrt(9 / 112) / (1 - drop / 4)
    return drop / (math.sqrt(3) * (1 + response.beta))
