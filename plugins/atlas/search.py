"""Atlas's plan search. Pure: candidates are ranked by the closed form (estimate.py) and the
promising ones are measured with a `measure` callback (the simulator, through the planning
context). The search is staged so that its cost stays practical:

1. every placement (DC subset in its best chain order, dp, pp) at its closed-form-best
   schedule; the closed form's best placements, the best over every DC and the best on
   each DC subset are simulated;
2. from the simulated leaders, a local search over neighbouring placements (dp and pp one
   step away on the same DCs) while a step improves;
3. for the best placements, every schedule (GPipe, 1F1B and its warm-up depths, and the
   `more` the pool leaves out: torch's interleaved 1F1B and zero-bubble orders over two
   stages per GPU where they fit in memory, made only here since checking them costs
   torch's orders), then every DP-cell size, fair sharing, and one connection per pair
   for the best schedule.

`grid` measures every placement and schedule instead (the brute force over DC subset,
dp, pp and schedule), `exhaustive` also each one's every mechanism: ground truths to check
the staged search against.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from testbed.policy.api import Schedule

from .placement import Chain

LEADERS = 3
"""Simulated placements a local search starts from."""
SHORTLIST = 8
"""Placements simulated from the closed form's ranking (and as many over every DC)."""
REFINED = 2
"""Best placements whose every schedule and mechanism are simulated."""
MAX_SUBSETS = 64
"""DC subsets whose best placement is simulated (all of them up to 6 DCs)."""
MAX_STEPS = 8
"""Local-search rounds; each moves to a faster neighbour or stops."""


@dataclass(frozen=True)
class Candidate:
    dcs: tuple[str, ...]
    dp: int
    pp: int
    chain: Chain
    predicted_s: float
    tokens: int
    simulated_s: float | None = None
    schedule_kind: Schedule = Schedule.ONE_F_ONE_B
    extra_warmup: int = 0
    per_crossing: bool = False
    """`extra_warmup` is per WAN crossing downstream of each stage: a stage whose
    microbatches cross more round trips before coming back keeps more of them in flight."""
    at_least: bool = False
    """`simulated_s` is a lower bound: its simulation stopped once it was sure to be
    slower than plans that matter more."""
    temporal: bool = True
    cell: int = 0
    """Replicas per DP-cell (they take turns on a link; cells share it fairly); 0: all."""
    multi: bool = True
    virtual: int = 1
    """Stages per GPU (torch's interleaved and V-shaped schedules): the chain's GPUs each
    hold this many, placed as torch maps them."""

    @property
    def warmup(self) -> int | tuple[int, ...]:
        """Extra warm-up forwards: one count for every stage, or one per stage."""
        if not self.per_crossing:
            return self.extra_warmup
        dcs = self.chain.stage_dcs()
        return tuple(self.extra_warmup * sum(1 for b in range(s + 1, len(dcs))
                                             if dcs[b] != dcs[b - 1])
                     for s in range(len(dcs)))

    @property
    def schedule(self) -> str:
        label = self.schedule_kind.label(self.warmup)
        looped = self.virtual > 1 and not self.schedule_kind.v_shaped
        return f"{label} x{self.virtual}" if looped else label

    @property
    def placement_key(self) -> tuple[Chain, int]:
        return (self.chain, self.dp)

    @property
    def key(self) -> tuple[Any, ...]:
        """What the plan depends on: equal keys make equal plans."""
        cell = (self.cell or self.dp) if self.temporal else 0
        return (self.chain, self.dp, self.schedule, self.temporal, cell, self.multi)

    @property
    def cells(self) -> tuple[tuple[int, ...], ...]:
        if not self.temporal:
            return ()
        size = self.cell or self.dp
        return tuple(tuple(range(i, min(i + size, self.dp))) for i in range(0, self.dp, size))

    @property
    def seconds(self) -> float:
        return self.simulated_s if self.simulated_s is not None else self.predicted_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def describe(self) -> dict[str, Any]:
        return {"dcs": list(self.chain.dcs), "stages": list(self.chain.stages), "dp": self.dp,
                "pp": self.pp, "schedule": self.schedule, "temporal": self.temporal,
                "dp_cell": (self.cell or self.dp) if self.temporal else None,
                "multi_connection": self.multi, "predicted_s": round(self.predicted_s, 4),
                "simulated_s": None if self.simulated_s is None else round(self.simulated_s, 4),
                "at_least": self.at_least,
                "tokens_per_s": round(self.tokens_per_s, 1)}


@dataclass(frozen=True)
class Choice:
    """A search's answer as the planning store keeps it: the candidate chosen, every one
    measured (the chosen first), and why it won."""

    chosen: Candidate
    considered: list[Candidate]
    why: str

    def ranked_first(self) -> bool:
        """Whether the chosen is the first and fastest of those listed, and measured
        exactly, as a search ranks them (a bound never wins: it is below a floor some
        candidate measured above it set)."""
        best = self.chosen.tokens_per_s
        return not self.chosen.at_least and self.considered[:1] == [self.chosen] and \
            all(c.tokens_per_s <= best for c in self.considered)


Waiter = Callable[[], "Candidate | None"]
Measure = Callable[[Candidate, "float | None"], Waiter]
"""Starts measuring a candidate and returns what waits for the result; the second
argument is a floor in tokens/s: a candidate sure to fall below it may be returned with a
lower bound on its time (`at_least`). A measure that runs at once returns its result in
a function that has it; one whose answer another measurement gives returns it in `Known`."""


class Known:
    """A waiter whose answer takes no process of its own (kept from an earlier
    measurement, or the same plan measured for another candidate): `Search.run` starts
    the next measurements beside it, so that the processes do not wait on it."""

    def __init__(self, wait: Waiter) -> None:
        self._wait = wait

    def __call__(self) -> Candidate | None:
        return self._wait()


Mode = Literal["staged", "grid", "exhaustive"]


@dataclass
class _Started:
    """A candidate under way in `Search.run`."""

    candidate: Candidate
    measuring: bool
    lowest: float | None
    """The floor it was started with."""
    waiter: Waiter | None
    """None: what is known of it will do."""
    sure: bool
    """Checked against the floor it is due (else started early, on the floor known then)."""


@dataclass
class Search:
    """The candidates measured so far, by key. With `bounded`, a measurement stops once the
    candidate is sure to fall below a floor where it changes nothing the staged search
    decides: the LEADERS-th best placement so far (only the best LEADERS placements lead
    or are refined), in a local search also where it stands (only better neighbours
    move it), and while refining a placement, that placement's best so far."""

    measure: Measure
    known: Callable[[Candidate, float | None], Waiter | None] = lambda _c, _f: None
    """Where a measurement on this floor is answered by what is kept (no run): that."""
    measured: dict[tuple[Any, ...], Candidate | None] = field(default_factory=dict)
    bounded: bool = False
    ahead: int = 1
    """Measurements under way at once (the processes measuring). Candidate i is due the
    floor those before i - ahead + 1 give once they are in; with more than one, it is
    started a step early, on the floor known then (one result fewer in), so that a
    process that is done need not wait for an earlier candidate, and that run is kept:
    the floor it was started on is never above the one it is due, so it measures the
    candidate at least as far. What is known when each starts follows from the order
    alone, so the results, and what was stopped early, are the same in every run on as
    many processes; with more than one, some floors are lower than one after another
    would give (fewer candidates stop early), which changes no choice (see `run`)."""

    def run(self, candidates: Iterable[Candidate],
            floor: Callable[[], float | None] | None = None) -> list[Candidate]:
        """Measure each; `floor` (tokens/s, asked before each is started) replaces
        `leaders_floor`. A floor only rises as results come in, and a candidate stopped
        below a floor would have been measured below it too: starting some with a lower
        floor measures them further, never to a different rank among those above it."""
        out: list[Candidate] = []
        started: deque[_Started] = deque()
        for candidate in candidates:
            if any(s.candidate.key == candidate.key for s in started):
                while started:  # the same plan under way: its result first
                    self._collect(started, out, floor)
            while self._full(started):
                self._collect(started, out, floor)
            started.append(self._start(candidate, floor, sure=len(started) < self.ahead))
        while started:
            self._collect(started, out, floor)
        return out

    def _full(self, started: deque[_Started]) -> bool:
        """Whether those under way are collected from before another starts: with one
        process every candidate waits for all before it (nothing runs beside it); with
        more, once `ahead` and one started early take a process each (a `Known` answer
        takes none)."""
        if self.ahead == 1:
            return bool(started)
        return _busy(started) >= self.ahead + 1

    def _start(self, candidate: Candidate, floor: Callable[[], float | None] | None,
               sure: bool) -> _Started:
        """The candidate's measurement started, unless what is known of it will do; `sure`:
        with the floor it is due (those before i - ahead + 1 are in)."""
        measuring, lowest = self._due(candidate, floor)
        return _Started(candidate, measuring, lowest,
                        self.measure(candidate, lowest) if measuring else None, sure)

    def _due(self, candidate: Candidate, floor: Callable[[], float | None] | None
             ) -> tuple[bool, float | None]:
        """Whether the candidate is to be measured now, and with which floor."""
        known = self.measured.get(candidate.key)
        if candidate.key not in self.measured or (known is not None and known.at_least):
            lowest = (floor or self.leaders_floor)() if self.bounded else None
            if known is None or lowest is None or known.tokens_per_s >= lowest:
                return True, lowest
        return False, None

    def _collect(self, started: deque[_Started], out: list[Candidate],
                 floor: Callable[[], float | None] | None) -> None:
        """The first under way, in; then the one whose floor that completes checked."""
        entry = started.popleft()
        if entry.waiter is not None:
            self.measured[entry.candidate.key] = entry.waiter()
        result = self.measured[entry.candidate.key]
        if result is not None:
            out.append(result)
        if len(started) >= self.ahead and not started[self.ahead - 1].sure:
            self._confirm(started[self.ahead - 1], floor)

    def _confirm(self, entry: _Started, floor: Callable[[], float | None] | None) -> None:
        """A candidate started early, checked once those before i - ahead + 1 are in: its
        run is kept where it is due one (started on a floor no higher than its due one,
        it goes at least as far) and what is kept does not answer the due floor (as in a
        search again, whose answers kept start many early); one is started where what
        was known then would have done and no longer does; none where what is known
        now will do."""
        measuring, lowest = self._due(entry.candidate, floor)
        kept = self.known(entry.candidate, lowest) if measuring and lowest != entry.lowest \
            else None
        if kept is not None:
            entry.lowest, entry.waiter = lowest, kept
        elif measuring != entry.measuring:
            entry.measuring, entry.lowest = measuring, lowest
            entry.waiter = self.measure(entry.candidate, lowest) if measuring else None
        entry.sure = True

    def leaders_floor(self) -> float | None:
        """The LEADERS-th best distinct placement's tokens/s; None while fewer are known."""
        leaders = _distinct_placements(self.ranked())[:LEADERS]
        return leaders[-1].tokens_per_s if len(leaders) == LEADERS else None

    def best(self, where: Callable[[Candidate], bool]) -> Candidate | None:
        done = [c for c in self.measured.values() if c is not None and where(c)]
        return max(done, key=lambda c: c.tokens_per_s, default=None)

    def ranked(self) -> list[Candidate]:
        return sorted((c for c in self.measured.values() if c is not None),
                      key=lambda c: (-c.tokens_per_s, repr(c.key)))


def _busy(started: Iterable[_Started]) -> int:
    """Measurements under way that take a process."""
    return sum(1 for s in started if s.waiter is not None and not isinstance(s.waiter, Known))


def search(pool: Sequence[Candidate], measure: Measure,
           mechanisms: Callable[[Candidate], list[Candidate]], every_dc: int,
           mode: Mode = "staged",
           more: Callable[[Candidate], list[Candidate]] = lambda _c: [], ahead: int = 1,
           known: Callable[[Candidate, float | None], Waiter | None] = lambda _c, _f: None
           ) -> Search:
    """Measure the candidates worth measuring (see the module's docstring), `ahead` at
    once (Search.ahead). `more`: a placement's schedules left out of the pool (given the
    pool's best candidate there); `known`: Search.known."""
    state = Search(measure, known, bounded=mode == "staged", ahead=ahead)
    by_placement = _best_per_placement(pool)
    if mode in ("grid", "exhaustive"):
        every = [*pool, *(c for p in by_placement.values() for c in more(p))]
        state.run(every)
        if mode == "exhaustive":
            state.run(v for c in every for v in mechanisms(c))
        return state
    probes = _probes(pool)
    first = list(by_placement.values())

    def probe(placements: Iterable[Candidate],
              floor: Callable[[], float | None] | None = None) -> list[Candidate]:
        return state.run((c for p in placements for c in probes.get(p.placement_key, [p])),
                         floor)

    probe(first[:SHORTLIST])
    probe([c for c in first if len(c.dcs) == every_dc][:SHORTLIST])
    # the closed form's best placement on every DC subset: it misjudges whole subsets
    by_subset: dict[frozenset[str], Candidate] = {}
    for candidate in first:
        by_subset.setdefault(frozenset(candidate.dcs), candidate)
    probe(list(by_subset.values())[:MAX_SUBSETS])
    # local search from the leaders over neighbouring placements
    leaders = _distinct_placements(state.ranked())[:LEADERS]
    for leader in leaders:
        current = leader
        for _ in range(MAX_STEPS):
            neighbours = [by_placement[k] for k in _neighbour_keys(current, by_placement)]
            better = [c for c in probe(neighbours, _below_both(state, current))
                      if c.tokens_per_s > current.tokens_per_s]
            if not better:
                break
            current = max(better, key=lambda c: c.tokens_per_s)
    # every schedule, then every mechanism, of the best placements
    for top in _distinct_placements(state.ranked())[:REFINED]:
        schedules = [c for c in pool if c.placement_key == top.placement_key]
        schedules += more(by_placement[top.placement_key])
        placement_best = _best_at(state, top)
        state.run(schedules, placement_best)
        best_schedule = state.best(_at(top))
        if best_schedule is not None:
            state.run(mechanisms(best_schedule), placement_best)
            # and the best mechanism with every schedule
            best = state.best(_at(top))
            if best is not None:
                state.run((replace(c, temporal=best.temporal, cell=best.cell, multi=best.multi,
                                   simulated_s=None, at_least=False) for c in schedules),
                          placement_best)
    return state


def _below_both(state: Search, current: Candidate) -> Callable[[], float | None]:
    """A local search's floor: below the leaders' and below where it stands."""
    def floor() -> float | None:
        leaders = state.leaders_floor()
        return None if leaders is None else min(leaders, current.tokens_per_s)
    return floor


def _best_at(state: Search, top: Candidate) -> Callable[[], float | None]:
    """While refining a placement: its best so far."""
    def floor() -> float | None:
        best = state.best(_at(top))
        return None if best is None else best.tokens_per_s
    return floor


def _at(top: Candidate) -> Callable[[Candidate], bool]:
    return lambda c: c.placement_key == top.placement_key


def _best_per_placement(pool: Sequence[Candidate]) -> dict[tuple[Chain, int], Candidate]:
    out: dict[tuple[Chain, int], Candidate] = {}
    for candidate in pool:  # best first
        out.setdefault(candidate.placement_key, candidate)
    return out


def _probes(pool: Sequence[Candidate]) -> dict[tuple[Chain, int], list[Candidate]]:
    """Per placement, the closed form's best schedule of each kind of warm-up (uniform
    and per WAN crossing): the closed form ranks placements well but not warm-ups."""
    out: dict[tuple[Chain, int], dict[tuple[Schedule, bool], Candidate]] = {}
    for candidate in pool:  # best first
        family = (candidate.schedule_kind, candidate.per_crossing)
        if candidate.schedule_kind is Schedule.ONE_F_ONE_B:
            out.setdefault(candidate.placement_key, {}).setdefault(family, candidate)
    return {key: list(best.values()) for key, best in out.items()}


def _distinct_placements(ranked: Sequence[Candidate]) -> list[Candidate]:
    seen: set[tuple[Chain, int]] = set()
    out = []
    for candidate in ranked:
        if candidate.placement_key not in seen:
            seen.add(candidate.placement_key)
            out.append(candidate)
    return out


def _neighbour_keys(current: Candidate, by_placement: dict[tuple[Chain, int], Candidate]
                    ) -> list[tuple[Chain, int]]:
    """Placements on the same DCs with dp or pp one step away."""
    out = []
    for (chain, dp), candidate in by_placement.items():
        if set(chain.dcs) != set(current.dcs):
            continue
        steps = abs(dp - current.dp) + abs(candidate.pp - current.pp)
        if steps == 1:
            out.append((chain, dp))
    return out
