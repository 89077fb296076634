"""The worker's data plane without namespaces: stage runners of a small plan over real
transports on localhost, emulated compute, and a stand-in for the coordinator's control
connection that grants every request and answers every bubble with `idle`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import mmap
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, get_args

import pytest

from testbed.common.spans import Span, SpanKind
from testbed.emulator.runtime.wire.messages import (
    CollectiveSetup,
    Config,
    EmulatedTiming,
    Idle,
    PeerInfo,
)
from testbed.emulator.runtime.worker.compute.engines import EmulatedEngine, make_engines
from testbed.emulator.runtime.worker.process import make_transport
from testbed.emulator.runtime.worker.stage_runner import StageRunner
from testbed.job.model import ModelShape
from testbed.plan.buckets import bucket_ready
from testbed.plan.collective import Collective
from testbed.plan.model import Action, Op
from testbed.plan.schedules import stage_actions

TOKEN = b"t" * 32
ACTIVATION = 64
GRADIENTS = 32


class Control:
    """Reads what a runner tells the coordinator and answers as the coordinator would."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.runner: StageRunner | None = None

    def write(self, data: bytes) -> None:
        (length,) = struct.unpack("!I", data[:4])
        message = json.loads(data[4 : 4 + length])
        self.messages.append(message)
        runner = self.runner
        assert runner is not None
        loop = asyncio.get_running_loop()
        if message["op"] == "request":
            loop.call_soon(runner.grants.pop(message["tag"]).set_result, None)
        elif message["op"] == "bubble":
            reply = runner.bubble_reply
            assert reply is not None
            loop.call_soon(reply.set_result, Idle())

    async def drain(self) -> None:
        return None


def _dc(stage: int) -> str:
    return "east" if stage == 0 else "west"


Tails = list[list[str]]
"""What every stage runs after its step in each iteration of a cycle ({s}: the stage)."""


def _config(replica: int, stage: int, dp: int, pp: int, microbatches: int,
            arbitrated: bool, bubbles: bool, tails: Tails | None = None,
            modeled_s: float | None = None, schedule: str = "1f1b",
            activation: int = ACTIVATION, gradients: int = GRADIENTS,
            forward_s: float = 0.0) -> Config:
    def peer(r: int, s: int) -> PeerInfo:
        return PeerInfo(r * pp + s, f"{_dc(s)}-{r * pp + s}", _dc(s))

    me = peer(replica, stage)
    if tails is None:
        programs = [[str(a) for a in stage_actions(schedule, stage, pp, microbatches, dp)]]
    else:
        body = [str(a) for a in stage_actions(schedule, stage, pp, microbatches, dp,
                                              gradients=None)]
        programs = [body + [a.format(s=stage) for a in tail] for tail in tails]
    joined = {Action.parse(a).subject for p in programs for a in p
              if Action.parse(a).op.is_collective and Action.parse(a).op is not Op.OUTER_STEP}
    return Config(
        index=me.index, gpu=me.gpu, dc=me.dc, address="127.0.0.1", replica=replica,
        stages=[stage], programs=programs, cycle=list(range(len(programs))) if tails else [],
        neighbours={str(s): peer(replica, s) for s in (stage - 1, stage + 1) if 0 <= s < pp},
        collectives=[CollectiveSetup(stage, str(c), gradients,
                                     [peer(r, stage) for r in range(dp)], modeled_s)
                     for c in sorted(joined)],
        arbitrated=["east>west", "west>east"] if arbitrated else [], iterations=2,
        compute="emulated", model=ModelShape(pp, 8, 1, 4, 16), layers=[1] * pp, seed=0,
        dp=dp, microbatches=microbatches, microbatch_size=1, activation_bytes=activation,
        emulated={str(stage): EmulatedTiming(forward_s, 0.0, 0.0, 0.0)}, local_rank=0,
        bubbles=bubbles)


async def _run(dp: int, pp: int, microbatches: int, arbitrated: bool = False,
               bubbles: bool = False, tails: Tails | None = None, iterations: int = 2,
               modeled_s: float | None = None, schedule: str = "1f1b",
               activation: int = ACTIVATION, gradients: int = GRADIENTS,
               forward_s: Sequence[float] = ()) -> tuple[list[StageRunner], list[Control]]:
    """`forward_s`: each stage's forward time (default none)."""
    configs = [_config(r, s, dp, pp, microbatches, arbitrated, bubbles, tails, modeled_s,
                       schedule, activation, gradients, forward_s[s] if forward_s else 0.0)
               for r in range(dp) for s in range(pp)]
    return await _run_configs(configs, iterations)


async def _run_configs(configs: list[Config], iterations: int = 2,
                       losses: dict[int, list[float]] | None = None,
                       finish: Callable[[list[StageRunner]], Awaitable[None]] | None = None
                       ) -> tuple[list[StageRunner], list[Control]]:
    """Stage runners of `configs` over real transports on localhost, emulated engines
    (engines and transports as the worker makes them); `losses`: where to keep each
    iteration's losses as the runners report them; `finish`: what the runners do after
    training, their connections still open."""
    transports = [make_transport(c, TOKEN) for c in configs]
    ports = [await t.listen("127.0.0.1", 0) for t in transports]
    n = len(configs)
    await asyncio.gather(*(
        t.connect({j: ("127.0.0.1", ports[j], 1) for j in range(i + 1, n)},
                  dict.fromkeys(range(i), 1))
        for i, t in enumerate(transports)))
    controls, runners = [], []
    for config, transport in zip(configs, transports, strict=True):
        engines = make_engines(config)
        control = Control()
        runner = StageRunner(config, engines, transport, control)  # type: ignore[arg-type]
        control.runner = runner
        controls.append(control)
        runners.append(runner)
    try:
        for iteration in range(iterations):
            reported = await asyncio.wait_for(
                asyncio.gather(*(r.run_iteration(iteration) for r in runners)), 30)
            if losses is not None:
                losses[iteration] = [loss for loss in reported if loss is not None]
        await asyncio.gather(*(r.collectives.drain() for r in runners))
        if finish is not None:
            await asyncio.wait_for(finish(runners), 60)
    finally:
        await asyncio.gather(*(t.close() for t in transports))
        for runner in runners:
            runner.executor.shutdown(wait=False)
    return runners, controls


def test_a_pipeline_with_replicas_runs_every_step_and_names_messages_as_before() -> None:
    dp, pp, microbatches = 2, 3, 4
    runners, _ = asyncio.run(_run(dp, pp, microbatches))
    sent, received = Counter[str](), Counter[str]()
    for runner in runners:
        cfg = runner.config
        kinds = Counter(s["kind"] for s in runner.spans)
        assert kinds["forward"] == kinds["backward"] == 2 * microbatches
        assert kinds["step"] == kinds["allreduce"] == 2
        for span in runner.spans:
            assert Span.__required_keys__ <= set(span) <= Span.__required_keys__ | \
                Span.__optional_keys__, span
            assert span["kind"] in get_args(SpanKind)
            assert span["gpu"] == cfg.gpu and span["stage"] == cfg.stage
            if span["kind"] == "send" and span["tag"][0] in "FB":
                sent[span["tag"]] += 1
            if span["kind"] == "transfer" and span["tag"][0] in "FB":
                received[span["tag"]] += 1
                assert span["dst"] == cfg.gpu and span["bytes"] == ACTIVATION
                assert span["link"] == (None if span["src"].split("-")[0] == _dc(cfg.stage)
                                        else f"{span['src'].split('-')[0]}>{_dc(cfg.stage)}")
            if span["kind"] == "recv":
                assert str(cfg.programs[0][span["action"]]).startswith(f"{cfg.stage}RECV_")
    assert sent == received
    expected = {f"{d}:{i}:{r}:{s}:{mb}"
                for i, r, mb in itertools.product(range(2), range(dp), range(microbatches))
                for d, s in [("F", s) for s in range(1, pp)] + [("B", s) for s in range(pp - 1)]}
    assert set(sent) == expected
    assert set(sent.values()) == {1}


def test_arbitrated_links_wait_for_a_grant_and_bubbles_ask_the_coordinator() -> None:
    runners, controls = asyncio.run(_run(1, 2, 3, arbitrated=True, bubbles=True))
    first, _ = controls
    requests = [m for m in first.messages if m["op"] == "request"]
    assert [m["tag"] for m in requests] == [f"F:{i}:0:1:{mb}" for i in range(2) for mb in range(3)]
    assert {m["kind"] for m in requests} == {"SEND_F"}
    assert all(m["link"] == "east>west" and m["bytes"] == ACTIVATION for m in requests)
    assert [m["tag"] for m in first.messages if m["op"] == "sent"] == \
        [m["tag"] for m in requests]
    grants = [s for s in runners[0].spans if s["kind"] == "wait_grant"]
    assert len(grants) == len(requests)
    bubbles = [m for c in controls for m in c.messages if m["op"] == "bubble"]
    assert bubbles and all(isinstance(m["action"], int) for m in bubbles)


def test_a_cycle_runs_its_programs_in_turn_and_a_started_sync_ends_in_a_later_iteration(
        ) -> None:
    """Every iteration reduces gradients inside the DC; the deltas' all-reduce starts after
    the step of the cycle's first iteration and is awaited in its third. Rings are named
    by their group and the how-many-th join of it this is, so the two never mix."""
    tails = [["{s}ALLREDUCE_START[delta]"], [], ["{s}ALLREDUCE_WAIT[delta]", "{s}OUTER_STEP"]]
    runners, _ = asyncio.run(_run(2, 2, 2, tails=[["{s}ALLREDUCE[dc]", *t] for t in tails],
                                  iterations=5))
    for runner in runners:
        stage = runner.config.stage
        rings = [(s["iteration"], s["collective"]) for s in runner.spans
                 if s["kind"] == "allreduce"]
        assert sorted(rings) == sorted([(i, "dc") for i in range(5)] + [(0, "delta"),
                                                                        (3, "delta")])
        outer = [s["iteration"] for s in runner.spans if s.get("collective") == "delta"
                 and s["kind"] == "outer_step"]
        assert outer == [2]
        waits = [s["iteration"] for s in runner.spans if s["kind"] == "wait_reduce"]
        assert waits == [2]  # the sync started in iteration 3 ends after the run
        tags = {s["tag"].rsplit(":", 1)[0] for s in runner.spans if s["kind"] == "transfer"
                and s["tag"].startswith("AR")}
        dc = runner.config.dc
        assert tags == {f"AR{stage}@{dc}:{k}" for k in range(5)} | {f"AR{stage}:{k}"
                                                                  for k in range(2)}


def test_a_modeled_ring_takes_its_time_without_making_the_stages_gradients() -> None:
    """Inside one DC with emulated compute a collective's bytes (GBs for a large stage)
    are never allocated: a token goes round and the modeled time is waited out."""
    async def modeled() -> tuple[list[StageRunner], list[Control]]:
        return await _run(2, 1, 2, modeled_s=0.05)

    with _no_contributions():
        runners, _ = asyncio.run(modeled())
    for runner in runners:
        rings = [s for s in runner.spans if s["kind"] == "allreduce"]
        assert len(rings) == 2
        for ring in rings:
            assert ring["end"] - ring["start"] >= 0.05
            assert ring.get("modeled") is True and ring["bytes"] == GRADIENTS
        assert not any(s["kind"] == "transfer" for s in runner.spans)  # a token is no bytes


def test_a_modeled_ring_ends_its_time_after_the_last_member_joined_for_every_member(
        ) -> None:
    """A collective starts when all its members are in: one that joined early waits for
    the late one and then the modeled time, as the simulator times it (not the modeled
    time from its own join, which let early replicas run ahead of a late one)."""
    modeled_s = 0.05
    configs = [dataclasses.replace(
        _config(r, 0, 2, 1, 2, False, False, modeled_s=modeled_s),
        emulated={"0": EmulatedTiming(0.1 * r, 0.0, 0.0, 0.0)}) for r in range(2)]
    runners, _ = asyncio.run(_run_configs(configs, iterations=1))
    rings = [s for r in runners for s in r.spans if s["kind"] == "allreduce"]
    last_join = max(ring["start"] for ring in rings)
    assert last_join - min(ring["start"] for ring in rings) >= 0.15  # the late one is late
    for ring in rings:
        assert ring["end"] >= last_join + modeled_s


@contextlib.contextmanager
def _no_contributions() -> Iterator[None]:
    """Fail any engine asked for its part of a collective's bytes."""
    def refuse(*_args: object) -> None:
        raise AssertionError("the engine was asked for a collective's bytes")

    original = EmulatedEngine.contribute
    EmulatedEngine.contribute = refuse  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        EmulatedEngine.contribute = original  # type: ignore[method-assign]


def _peak_growth(run: Callable[[], object]) -> int:
    """How far this process's resident set rose above where it was while `run` ran (the
    kernel's high-water mark, reset first)."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current size
    before = _status_kib("VmRSS")
    run()
    return (_status_kib("VmHWM") - before) * 1024


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(key)


def test_a_stage_behind_its_sender_keeps_sizes_not_the_payloads_piling_up() -> None:
    """GPipe: stage 0 sends its 32 microbatches' activations (8 MiB each) as fast as the
    connection takes them while stage 1 computes each for 30 ms, so most of them wait at
    stage 1 before it reads them: 256 MiB if it kept them. With emulated compute it keeps
    their sizes; zeros that take no memory stand in for every tensor sent."""
    activation, microbatches = 8 * 2**20, 32
    runners: list[StageRunner] = []

    def run() -> None:
        runners.extend(asyncio.run(_run(1, 2, microbatches, schedule="gpipe", iterations=1,
                                        activation=activation, forward_s=(0.0, 0.03)))[0])

    grew = _peak_growth(run)
    arrivals = [s for s in runners[1].spans if s["kind"] == "transfer"]
    assert len(arrivals) == microbatches
    assert {s["bytes"] for s in arrivals} == {activation}
    started = {s["microbatch"]: s["start"] for s in runners[1].spans if s["kind"] == "forward"}
    waiting = sum(1 for s in arrivals if s["end"] < started[s["microbatch"]] - 0.02)
    assert waiting >= microbatches // 2  # they did pile up
    assert grew < 48 * 2**20, f"resident set grew {grew / 2**20:.0f} MiB"


def test_a_ring_across_dcs_moves_the_collectives_bytes_without_holding_them() -> None:
    """Emulated compute across the WAN: 64 MiB of gradients per member cross real TCP in a
    ring of two (each member sends and receives 32 MiB chunks), and neither the
    contributions nor what arrives is held in memory."""
    gradients = 64 * 2**20
    runners: list[StageRunner] = []

    def run() -> None:
        runners.extend(asyncio.run(_run(2, 1, 1, iterations=1, gradients=gradients))[0])

    grew = _peak_growth(run)
    for runner in runners:
        moved = [s["bytes"] for s in runner.spans if s["kind"] == "transfer"]
        assert sum(moved) == gradients  # reduce-scatter and all-gather: a half each
    assert grew < 24 * 2**20, f"resident set grew {grew / 2**20:.0f} MiB"


def test_every_stage_of_an_emulated_worker_sends_zeros_that_take_no_memory() -> None:
    """A worker holding two stages (the first and the last) under split backwards: its
    forwards, whole backwards and input gradients are zeros of the activation's size from
    the one read-only mapping (testbed.emulator.runtime.worker.compute.zeros), never a buffer of
    their own."""
    config = _config(0, 0, 1, 3, 2, False, False, activation=2**20)
    config = dataclasses.replace(
        config, stages=[0, 2], emulated={"0": EmulatedTiming(0.0, 0.0, 0.0, 0.0),
                                         "2": EmulatedTiming(0.0, 0.0, 0.0, 0.0)})
    engines = make_engines(config)
    sent = [engines[0].forward(0, 0, None), engines[2].backward(0, 0, None),
            engines[2].input_gradient(0, 1, None)]
    assert engines[2].forward(0, 0, None) is None and engines[0].backward(0, 0, None) is None
    for payload in sent:
        assert isinstance(payload, memoryview) and payload.readonly
        assert isinstance(payload.obj, mmap.mmap) and payload.nbytes == 2**20
        assert not any(payload)


def test_an_emulated_worker_imports_no_torch() -> None:
    """A worker process with emulated compute: its modules, engine, transport and a
    pipeline with replicas and all-reduces, in a fresh interpreter."""
    script = ("import asyncio, sys\n"
              "import testbed.emulator.runtime.worker.process\n"
              "from tests.test_stage_runner import _run\n"
              "asyncio.run(_run(2, 2, 4))\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_buckets_start_in_the_backward_as_it_has_their_values() -> None:
    """Emulated compute holds the GPU for the backward's time and starts each bucket's
    all-reduce that far into it as testbed.plan.buckets puts its values' readiness, in
    the plan's order; the step waits for all of them."""
    dp, backward_s, buckets = 2, 0.2, 3
    configs = []
    for replica in range(dp):
        config = _config(replica, 0, dp, 1, 2, False, False)
        actions = stage_actions("1f1b", 0, 1, 2, dp, buckets=buckets)
        subjects = [f"b{k}/{buckets}" for k in range(buckets)]
        configs.append(dataclasses.replace(
            config, programs=[[str(a) for a in actions]],
            collectives=[dataclasses.replace(config.collectives[0], collective=c)
                         for c in subjects],
            emulated={"0": EmulatedTiming(0.0, backward_s, 0.0, 0.0)}))
    runners, _ = asyncio.run(_run_configs(configs, 2))
    for runner in runners:
        for iteration in range(2):
            last = max((s for s in runner.spans if s["kind"] == "backward"
                        and s["iteration"] == iteration), key=lambda s: s["start"])
            rings = sorted((s for s in runner.spans if s["kind"] == "allreduce"
                            and s["iteration"] == iteration), key=lambda s: s["start"])
            assert [s["collective"] for s in rings] == [f"b{k}/{buckets}"
                                                        for k in range(buckets)]
            for k, ring in enumerate(rings):
                ready = bucket_ready(configs[0].model, (1,), 0,
                                     Collective(bucket=k, buckets=buckets))
                assert ring["start"] == pytest.approx(last["start"] + ready * backward_s,
                                                      abs=0.03)
            step = next(s for s in runner.spans if s["kind"] == "step"
                        and s["iteration"] == iteration)
            assert step["start"] >= max(s["end"] for s in rings)
