"""How each of a pair's TCP connections fares on a lossy path (testbed.sim.flows.Pair):
its own window through loss cycles, where its first loss falls, and the pieces of a
message it holds. Pure."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.plan.tcp_model import MSS, LossResponse

SETTLED = 0.01
"""A loss cycle whose window at the loss is within this of the last one's repeats."""


@dataclass
class Stripes:
    """One message as it rides a lossy pair's connections (Pair.open_round)."""

    chunk: float
    """Its piece size (testbed.plan.striping)."""
    taken: list[float]
    """Per connection, the bytes of the pieces it has taken and not yet sent."""
    sends: list[float] = field(default_factory=list)
    """Per connection, what it sends in the round under way."""
    window: float = 0.0
    """The connections' windows' bytes as that round opened."""

    def deal(self, unassigned: float, wants: Callable[[int], bool]) -> float:
        """One piece, in turn, to each connection that `wants` one; what is left."""
        for i in range(len(self.taken)):
            if unassigned > 0.0 and wants(i):
                piece = min(self.chunk, unassigned)
                self.taken[i] += piece
                unassigned -= piece
        return unassigned

    def sent(self, nbytes: float) -> list[float]:
        """The round's `nbytes`, per connection (each in proportion to what it was to
        send, where the round sent less), taken off what each holds."""
        planned = sum(self.sends)
        scale = nbytes / planned if planned > 0.0 else 0.0
        sent = [each * scale for each in self.sends]
        self.taken = [max(0.0, held - each) for held, each in zip(self.taken, sent,
                                                                  strict=True)]
        return sent


def first_losses(connections: int) -> list[float]:
    """Where each of a pair's connections loses its first packet, in units of 1/loss
    packets it sent: the k-th earliest of N where the k-th smallest of N exponential
    draws of mean 1 falls on average, H_N - H_(N-k) (H: the harmonic numbers; Rényi's
    representation of exponential order statistics). One connection alone loses first
    after 1/loss packets, as every later loss comes (LossCycle); of sixteen, the first
    after 0.06/loss and the last after 3.4/loss."""
    harmonic = [0.0, *itertools.accumulate(1.0 / n for n in range(1, connections + 1))]
    return [harmonic[connections] - harmonic[connections - k] for k in range(1, connections + 1)]


@dataclass
class LossCycle:
    """One connection's window on a lossy path: a loss every 1/loss packets it sends (the
    mean path of Mathis et al. 1997's periodic model), the first after `first` of those;
    at a loss the window drops by the congestion control's factor and grows back as it
    does (LossResponse.window_after). Up to its first loss its buffers let it keep their
    whole window in flight; from then on the holes losses leave hold part of them (the
    pair's `held`)."""

    cwnd: float
    first: float
    """Before its first loss, its share of 1/loss packets it sends until then; 1 after."""
    ssthresh: float = float("inf")
    w_max: float = 0.0
    """The window at the last loss (CUBIC's W_max)."""
    epoch: float = 0.0
    """When the last loss was."""
    since_loss: float = 0.0
    """Bytes sent since its last loss."""
    carried: float = 0.0
    """Bytes it sent in the rounds its own window set (those a loss may end: once every
    connection's window settles, the pair sends as one)."""
    settled: bool = False
    """Its loss cycle repeats: its window is the cycle's mean, and no loss is tracked."""
    conserved: bool = False
    """BBR: its last round was one of recovery's packet conservation."""
    lost: bool = False
    """It has lost a packet: the buffers keep `held` of their window in flight."""

    def acked(self, nbytes: float, now: float, response: LossResponse, loss: float,
              window: float, held: float, rtt: float) -> None:
        """A round that brought its `nbytes` acknowledged: its window grows, or drops
        where those bring its bytes since its last loss to its next loss. `window`: what
        the buffers let it keep in flight before its first loss; `held`: after it."""
        limit = held if self.lost else window
        self.since_loss += nbytes
        if response.beta >= 1.0:  # BBR: a round of recovery conserves packets
            if self.since_loss >= self.first * MSS / loss and not self.conserved:
                self.since_loss, self.conserved, self.first = 0.0, True, 1.0
                self.lost, self.cwnd = True, min(self.cwnd, held)
            else:
                self.conserved = False
                self.cwnd = min(limit, self.cwnd + nbytes)
                # a window at what the buffers hold, loss does not shrink: it stays
                self.settled = self.lost and self.cwnd >= held
            return
        if self.since_loss >= self.first * MSS / loss:
            previous, cycle_s = self.w_max, now - self.epoch
            self.since_loss, self.first, self.lost = 0.0, 1.0, True
            self.w_max = min(self.cwnd, limit)
            self.cwnd = self.ssthresh = max(2 * MSS, self.w_max * response.beta)
            self.epoch = now
            if abs(self.w_max - previous) <= SETTLED * previous and cycle_s > 0:
                # the cycle repeats: its mean window from now on, without a round each
                # round trip (which a short round trip would make millions of)
                self.settled = True
                self.cwnd = min(held, MSS / loss / cycle_s * rtt)
        elif self.cwnd < self.ssthresh:
            self.cwnd = min(limit, self.cwnd + nbytes)
        else:
            grown = response.window_after(now - self.epoch, rtt, self.w_max)
            self.cwnd = min(limit, max(self.cwnd, min(grown, self.cwnd + nbytes)))
