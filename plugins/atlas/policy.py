"""Atlas: placement with DP inside DCs, DC selection, multiple TCP connections, and
temporal sharing of WAN links. Its ablations are registered as policies of their own."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from testbed.policy.api import (
    Action,
    HostLimits,
    HostTcp,
    InputError,
    Job,
    LinkKind,
    Op,
    Plan,
    PlanningContext,
    Schedule,
    Sharing,
    Topology,
    TrainingPolicy,
    Transfer,
    build_plan,
    fits_memory,
)

from .estimate import LINUX_DEFAULTS, connections_to_fill, estimate, lower_bound
from .explain import why_chosen
from .placement import Chain, capacity, fill, largest_first, place, tie_orders
from .probe import searched_job
from .ranking import Queues, needed_at
from .schedules import one_per_gpu, placed, two_per_gpu
from .search import Candidate, Choice, Known, search
from .settings import AtlasSettings
from .twins import Answer, once, reused, twin

RECEIVE_INDEXES = 8
"""Plans whose receive positions the policy keeps at once."""
TransferKey = tuple[Op, int, int, int]
"""What a transfer's receive position depends on: kind, sending stage, replica,
microbatch."""


class AtlasPolicy(TrainingPolicy):
    name = "atlas"
    summary = ("Atlas: stages over DCs (DP inside DCs), DC selection, N TCP connections, "
               "temporal WAN sharing")
    settings_type: ClassVar[type[Any]] = AtlasSettings
    settings: AtlasSettings
    multi_connection: ClassVar[bool] = True

    # --- the plan ----------------------------------------------------------------------

    limits: HostLimits = LINUX_DEFAULTS
    """The hosts' limits on connections, from the planning context."""

    def __init__(self, **values: str) -> None:
        super().__init__(**values)
        self._receive_index: dict[int, tuple[Plan, dict[str, dict[Action, int]],
                                             dict[TransferKey, int], dict[int, Any],
                                             Queues]] = {}

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        began = time.monotonic()
        self.limits = context.host_limits
        chosen, considered, why, kept = self.decided(topology, job, context)
        plan = self._assemble(topology, job, chosen)
        notes = dict(plan.notes)
        notes["dc_selection"] = {"chosen": chosen.describe(), "why": why,
                                 "candidates": [c.describe() for c in considered]}
        whole = chosen.virtual == 1 and chosen.schedule_kind in (Schedule.GPIPE,
                                                                 Schedule.ONE_F_ONE_B)
        bound = lower_bound(topology, job, chosen.chain.stage_dcs(), chosen.dp, job.tp,
                            waits_upstream=whole)
        notes["lower_bound_s"] = float(f"{bound:.4g}")  # four significant digits at any scale
        notes["planning_s"] = round(time.monotonic() - began, 2)
        notes["planning_kept"] = kept
        return replace(plan, notes=notes)

    def decided(self, topology: Topology, job: Job, context: PlanningContext
                ) -> tuple[Candidate, list[Candidate], str, bool]:
        """`choose`'s answer, and whether it was kept from an earlier command (the same
        inputs, processes and code: context.memo) instead of searched again. The search
        sees the job as `searched_job` gives it: runs that differ only in their length or
        their inference workload share it (within a command, and across commands)."""
        searched = searched_job(topology, job)
        key = ("atlas.choose", type(self).__name__, repr(topology), repr(searched),
               repr(self.settings), repr(self.limits), context.pool_size)
        kept = context.memo.get(key, Choice, functools.partial(self.holds, topology, searched,
                                                               context))
        if kept is not None:
            return kept.chosen, kept.considered, kept.why, True
        chosen, considered, why = self.choose(topology, searched, context)
        context.memo.put(key, Choice(chosen, considered, why))
        return chosen, considered, why, False

    def holds(self, topology: Topology, job: Job, context: PlanningContext,
              choice: Choice) -> bool:
        """Whether a kept choice is one this search makes (a plausible wrong one, such as
        its slowest candidate, is not used): ranked first, and its time the simulator's
        for its plan now (one candidate's share of a search; None for both where the
        closed form chose)."""
        return choice.ranked_first() and choice.chosen.simulated_s == context.simulate(
            self._assemble(topology, job, choice.chosen), job)

    def choose(self, topology: Topology, job: Job, context: PlanningContext
               ) -> tuple[Candidate, list[Candidate], str]:
        """The placement, schedule and mechanisms to run, what else was measured, and why
        this one won."""
        candidates = self._candidates(topology, job)
        if not candidates:
            raise InputError(f"no placement fits: whole stages per DC, each fitting in its "
                             f"GPUs' memory; the topology has "
                             f"{', '.join(f'{dc.name} {dc.gpus}' for dc in topology.datacenters)}"
                             " GPUs", topology.source, "job")
        every_dc = len(topology.datacenters)
        pool = candidates if self.settings.selection else \
            [c for c in candidates if len(c.dcs) == every_dc]
        if not pool:
            raise InputError("selection off, and no placement uses every datacenter",
                             topology.source, "job")
        probe = searched_job(topology, job)
        twins: dict[Any, tuple[float | None, Answer]] = {}
        with context.pool(lambda c, stop_above: context.simulate(
                self._assemble(topology, probe, c), probe, stop_above)) as simulations:
            state = search(pool, lambda c, floor: self._simulate(
                topology, probe, c, context, floor, simulations.submit, twins),
                self._mechanisms, every_dc, self.settings.search,
                lambda c: self._two_per_gpu(topology, job, c),
                simulations.size, lambda c, floor: self._kept(topology, probe, c, context,
                                                              floor))
        ranked = state.ranked()
        if not ranked:
            return pool[0], pool[:8], "closed-form estimate (the simulation failed)"
        return ranked[0], ranked, why_chosen(ranked, len(pool), self.settings.selection,
                                       self.settings.search)

    def _mechanisms(self, candidate: Candidate) -> list[Candidate]:
        """The candidate with fair sharing, each other DP-cell size, one connection."""
        base = replace(candidate, simulated_s=None, at_least=False)
        out = []
        if self.settings.temporal:
            out.append(replace(base, temporal=False, cell=0))
            out += [replace(base, temporal=True, cell=size)
                    for size in range(1, candidate.dp + 1)
                    if candidate.dp % size == 0 and size != (candidate.cell or candidate.dp)]
        if self.multi_connection and not self.settings.connections:
            out.append(replace(base, multi=not candidate.multi))
        return out

    def _connections(self, topology: Topology, dc_a: str, dc_b: str, multi: bool) -> int:
        if dc_a == dc_b or not multi:
            return 1
        fixed = self.settings.connections
        if fixed:
            return fixed
        return connections_to_fill(topology, dc_a, dc_b, self.limits,
                                   self.settings.max_connections)

    def _assemble(self, topology: Topology, job: Job, candidate: Candidate) -> Plan:
        placement = placed(topology, job, candidate.chain, candidate.dp,
                           candidate.schedule_kind, candidate.virtual)
        sharing = Sharing.ARBITRATED if candidate.temporal else Sharing.FAIR
        between = functools.cache(  # per DC pair: a plan has thousands of GPU pairs
            lambda a, b: self._connections(topology, a, b, candidate.multi))
        return build_plan(
            self.name, topology, job, placement, candidate.schedule_kind,
            extra_warmup=candidate.warmup,
            connections=lambda a, b, kind: between(topology.dc_of(a), topology.dc_of(b))
            if kind is LinkKind.PIPELINE else 1,
            sharing=sharing, dp_cells=candidate.cells,
            host_tcp=HostTcp(slow_start_after_idle=False) if self.settings.warm else None)

    def _candidates(self, topology: Topology, job: Job) -> list[Candidate]:
        """Every DC subset in its best chain order, every DP/PP split that fits, ranked by
        closed-form throughput; with selection off, only all DCs largest first. Where GPipe
        fits, every schedule of `one_per_gpu` does (it holds all m microbatches at once,
        the most an order of one stage per GPU can), so their orders are not checked one
        by one: most of the time this took went to checking them."""
        names = [dc.name for dc in topology.datacenters]
        subsets = [names] if not self.settings.selection else [
            list(c) for k in range(1, len(names) + 1) for c in itertools.combinations(names, k)]
        out: list[Candidate] = []
        for subset in subsets:
            for dp in self._dps(topology, job, subset):
                try:
                    m = job.microbatches_for(dp)
                except InputError:
                    continue
                for pp in self._pps(topology, job, subset, dp):
                    chain = self._best_chain(topology, job, subset, dp, pp)
                    if chain is None:
                        continue
                    placement = place(topology, chain, dp, job.tp)
                    conns = None if self.multi_connection else 1
                    if self.settings.connections:
                        conns = self.settings.connections
                    tokens = dp * m * job.microbatch_size * job.model.seq_len
                    schedules = [Candidate(tuple(chain.dcs), dp, pp, chain, 0.0, tokens,
                                           schedule_kind=kind, extra_warmup=extra,
                                           per_crossing=per_crossing,
                                           temporal=self.settings.temporal,
                                           multi=self.multi_connection)
                                 for kind, extra, per_crossing in one_per_gpu(m, len(chain.dcs))]
                    every_fits = fits_memory(topology, job, placement, Schedule.GPIPE)
                    for candidate in schedules:
                        kind, warmup = candidate.schedule_kind, candidate.warmup
                        if not every_fits and \
                                not fits_memory(topology, job, placement, kind, warmup):
                            continue
                        # GPipe keeps all m microbatches in flight, as 1F1B+m does
                        depth = m if kind is Schedule.GPIPE else warmup
                        predicted = estimate(topology, job, chain.stage_dcs(), dp, job.tp,
                                             conns, depth, self.limits).iteration_s
                        out.append(replace(candidate, predicted_s=predicted))
        out.sort(key=lambda c: -c.tokens_per_s)
        return out

    def _two_per_gpu(self, topology: Topology, job: Job, base: Candidate) -> list[Candidate]:
        """torch's orders over two stages per GPU of `base`'s placement, unless switched
        off (schedules.two_per_gpu)."""
        return two_per_gpu(topology, job, base) if self.settings.two_per_gpu else []

    def _dps(self, topology: Topology, job: Job, subset: Sequence[str]) -> list[int]:
        if job.dp is not None:
            return [job.dp]
        largest = max(topology.dc(n).gpus for n in subset) // job.tp
        return list(range(1, largest + 1))

    def _pps(self, topology: Topology, job: Job, subset: Sequence[str], dp: int) -> list[int]:
        room = capacity(topology, subset, dp, job.tp)
        if job.pp is not None:
            return [job.pp] if job.pp <= room else []
        # every DC of the subset must host a stage, and a stage needs a layer
        return list(range(len(subset), min(room, job.model.layers) + 1))

    def _best_chain(self, topology: Topology, job: Job, subset: Sequence[str], dp: int,
                    pp: int) -> Chain | None:
        """Largest DC first (Algorithm 1); among equally large DCs the order with the
        lowest WAN latency along the chain. None if some DC would host no stage."""
        best: tuple[float, Chain] | None = None
        base = largest_first(topology, subset)
        for order in tie_orders(topology, base):
            try:
                chain = fill(topology, order, pp, dp, job.tp)
            except InputError:
                continue
            if len(chain.dcs) != len(subset):
                continue
            latency = sum(topology.one_way_latency(a, b)
                          for a, b in itertools.pairwise(chain.dcs))
            if best is None or latency < best[0]:
                best = (latency, chain)
        return best[1] if best else None

    def _simulate(self, topology: Topology, probe: Job, candidate: Candidate,
                  context: PlanningContext, floor: float | None,
                  submit: Callable[..., Callable[[], float | None]],
                  twins: dict[Any, tuple[float | None, Answer]]
                  ) -> Callable[[], Candidate | None]:
        """Starts simulating the candidate (`submit(candidate, stop_above)`: a warm-up and
        two measured iterations, or one on large topologies); what it returns waits for
        the candidate with its iteration time, or None if it cannot run; below `floor`
        (tokens/s) only a lower bound on the time (`at_least`). Kept in the context's
        cache: ablations re-run Atlas's own selection. `twins`: by `twin`, the stop and
        the answer of each plan simulated in this search: a candidate whose plan is one of
        them takes its answer where the same run would give it (twins.py)."""
        kept = self._kept(topology, probe, candidate, context, floor)
        if kept is not None:
            return kept
        stop_above = None if floor is None else candidate.tokens / floor
        same = twin(probe, candidate)
        earlier = twins.get(same) if same is not None else None
        waiting = once(submit(candidate, stop_above) if earlier is None else
                       reused(earlier, stop_above, lambda: submit(candidate, stop_above)))
        if same is not None:
            twins[same] = (stop_above, waiting)

        def measured() -> Candidate | None:
            seconds = waiting()
            at_least = seconds is not None and stop_above is not None and seconds > stop_above
            context.cache[self._key(topology, probe, candidate)] = (seconds, at_least)
            return _result(candidate, seconds, at_least)
        return measured if earlier is None else Known(measured)

    def _kept(self, topology: Topology, probe: Job, candidate: Candidate,
              context: PlanningContext, floor: float | None) -> Known | None:
        """The candidate's answer in the context's cache, where a run on `floor` gives it:
        an exact time, or a bound above that run's stop."""
        stop_above = None if floor is None else candidate.tokens / floor
        known: tuple[float | None, bool] | None = context.cache.get(
            self._key(topology, probe, candidate))
        if known is None or (known[1] and (stop_above is None or known[0] is None
                                           or known[0] <= stop_above)):
            return None
        return Known(lambda: _result(candidate, *known))

    def _key(self, topology: Topology, probe: Job, candidate: Candidate) -> tuple[str, ...]:
        """What the candidate's simulated time depends on (the hosts' limits set its
        connections per pair)."""
        return ("atlas", repr(topology), repr(probe), repr(candidate.key),
                repr(replace(self.settings, search="staged")),  # any search: one result
                repr(self.limits))

    # --- temporal sharing ---------------------------------------------------------------

    def next_transfer(self, plan: Plan, link: tuple[str, str],
                      waiting: Sequence[Transfer]) -> Transfer:
        """pipeline: the lowest replica first, so one pipeline's transfers go back to back
        at full rate and the pipelines fall into a staggered rhythm where one computes
        while another sends; microbatch: the transfer the receiver needs soonest (its
        position in the receiver's action list); fifo: arrival order."""
        order = self.settings.order
        if order == "fifo":
            return min(waiting, key=lambda t: (t.ready_at, t.id))
        receives, known, ranks, queues = self._receives(plan)

        def rank(t: Transfer) -> tuple[int, int, int, int]:
            """(iteration, where its receiver waits for it, replica, id)."""
            key: TransferKey = (t.kind, t.stage, t.replica, t.microbatch)
            if key not in known:
                known[key] = needed_at(plan, receives, t)
            return (t.iteration, known[key], t.replica, t.id)

        if order == "microbatch":
            return queues.of(link, waiting[0].replica).least(waiting, rank)

        def ranked(t: Transfer) -> tuple[int, int, int, int]:
            """`rank`, made once per transfer while it waits: its link's queue is ranked
            anew at every grant."""
            mine = ranks.get(id(t))
            if mine is None or mine[0] is not t:
                mine = ranks[id(t)] = (t, rank(t))
            return mine[1]

        # pipeline: the receiver's position only among the lowest iteration and replica's
        first = min((t.iteration, t.replica) for t in waiting)
        chosen = min((t for t in waiting if (t.iteration, t.replica) == first), key=ranked)
        ranks.pop(id(chosen), None)
        return chosen

    def _receives(self, plan: Plan) -> tuple[dict[str, dict[Action, int]],
                                             dict[TransferKey, int], dict[int, Any],
                                             Queues]:
        """Where each receive sits in its GPU's action list, filled in per GPU as asked,
        each transfer's answer by what it depends on, the rank of each transfer waiting
        (by id, with the transfer), and the waiting transfers ranked per link and
        queue, for the last few plans this policy arbitrated (planning simulates many)."""
        cached = self._receive_index.get(id(plan))
        if cached is not None and cached[0] is plan:
            return cached[1], cached[2], cached[3], cached[4]
        if len(self._receive_index) >= RECEIVE_INDEXES:
            self._receive_index.pop(next(iter(self._receive_index)))
        entry: tuple[Plan, dict[str, dict[Action, int]], dict[TransferKey, int],
                     dict[int, Any], Queues] = (plan, {}, {}, {}, Queues(plan))
        self._receive_index[id(plan)] = entry
        return entry[1], entry[2], entry[3], entry[4]


def _result(candidate: Candidate, seconds: float | None, at_least: bool) -> Candidate | None:
    return None if seconds is None else replace(candidate, simulated_s=seconds,
                                                at_least=at_least)


class _Ablation(AtlasPolicy):
    """Full Atlas's choice of placement, with one mechanism switched off: so the table
    shows that mechanism's effect alone."""

    def full_choice(self, topology: Topology, job: Job, context: PlanningContext) -> Candidate:
        full = AtlasPolicy()
        full.settings = replace(self.settings, **{k: getattr(full.settings, k)
                                                  for k in self.fixed})
        full.limits = self.limits  # the hosts' limits, as plan() read them
        return full.decided(topology, job, context)[0]

    def holds(self, topology: Topology, job: Job, context: PlanningContext,
              choice: Choice) -> bool:
        """Full Atlas's choice (itself kept and checked), one mechanism off: made again."""
        return Choice(*self.choose(topology, job, context)) == choice


class AtlasNoMultiConnection(_Ablation):
    name = "atlas-no-multiconn"
    summary = "Atlas's placement with one TCP connection per peer pair (ablation)"
    fixed: ClassVar[dict[str, Any]] = {"connections": 1, "max_connections": 0}

    def choose(self, topology: Topology, job: Job, context: PlanningContext
               ) -> tuple[Candidate, list[Candidate], str]:
        chosen = replace(self.full_choice(topology, job, context), multi=False, simulated_s=None,
                         at_least=False)
        return chosen, [chosen], "atlas's placement, one connection per peer pair"


class AtlasNoTemporal(_Ablation):
    name = "atlas-no-temporal"
    summary = "Atlas's placement with fair (TCP) WAN sharing instead of temporal (ablation)"
    fixed: ClassVar[dict[str, Any]] = {"temporal": False}

    def choose(self, topology: Topology, job: Job, context: PlanningContext
               ) -> tuple[Candidate, list[Candidate], str]:
        chosen = replace(self.full_choice(topology, job, context), temporal=False,
                         simulated_s=None, at_least=False)
        return chosen, [chosen], "atlas's placement, fair WAN sharing"


class AtlasNoSelection(AtlasPolicy):
    name = "atlas-no-selection"
    summary = "Atlas using every DC, largest first, without DC selection (ablation)"
    fixed: ClassVar[dict[str, Any]] = {"selection": False}
