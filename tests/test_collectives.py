"""A collective's math on the worker: rings of real payloads (a delta sync's quantized
partial sums requantized at every hop), gathers of compressed gradients (each member's
compressed once), the quantization and top-k rules of the contract, which parameters each
fragment holds, and error feedback and outer state that survive a checkpoint."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch

from testbed.emulator.runtime.wire.messages import CollectiveSetup, Config, PeerInfo
from testbed.emulator.runtime.worker.collectives.allreduce import (
    Wire,
    chunk_bounds,
    ring_allgather,
    ring_allreduce,
)
from testbed.emulator.runtime.worker.collectives.payloads import Dense, Gathered, decode, encode
from testbed.emulator.runtime.worker.collectives.syncs import Syncs
from testbed.emulator.runtime.worker.compute.model import build_stages, parameter_fragments
from testbed.emulator.runtime.worker.compute.real_engine import RealEngine, real_engines
from testbed.job.fragments import fragment_params
from testbed.job.model import ModelShape
from testbed.plan.collective import Collective, Reduces, Scope, payload_bytes
from testbed.plan.model import OuterOptimizer
from tests.diloco_reference import compress, ring_sum, wire


class _Ring:
    """Members on one event loop, messages by (receiver, tag); counts bytes sent."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.mail: dict[tuple[int, str], asyncio.Future[bytearray]] = {}
        self.sent = 0

    def _box(self, member: int, tag: str) -> asyncio.Future[bytearray]:
        key = (member, tag)
        if key not in self.mail:
            self.mail[key] = asyncio.get_running_loop().create_future()
        return self.mail[key]

    def ends(self, position: int) -> tuple[object, object]:
        async def send(tag: str, data: Wire) -> None:
            self.sent += len(data)
            self._box((position + 1) % self.size, tag).set_result(bytearray(data))

        async def receive(tag: str) -> bytearray:
            return await self._box(position, tag)

        return send, receive


def _reduce(values: list[torch.Tensor], payload: str) -> tuple[list[torch.Tensor], int]:
    size = len(values)
    ring = _Ring(size)
    members = [Dense(v.clone(), size, payload) for v in values]

    async def run() -> None:
        await asyncio.gather(*(ring_allreduce(m, i, size, "t", *ring.ends(i))  # type: ignore[arg-type]
                               for i, m in enumerate(members)))

    asyncio.run(run())
    return [m.values for m in members], ring.sent


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("payload", ["", "bf16", "int8", "int4"])
def test_a_ring_sums_as_each_hop_reads_it_and_every_member_ends_equal(size: int,
                                                                     payload: str) -> None:
    torch.manual_seed(size)
    elements = 3 * 256 * size + 77  # whole blocks and a partial one
    values = [torch.randn(elements) for _ in range(size)]
    results, sent = _reduce(values, payload)
    expected = ring_sum(values, payload)
    for result in results:
        assert torch.equal(result, expected)
    # each chunk crosses n - 1 links as a partial sum and n - 1 as the sum
    assert sent == 2 * (size - 1) * payload_bytes(elements, payload, 4)


def test_a_dense_fp32_ring_is_the_exact_sum() -> None:
    values = [torch.full((1001,), float(i + 1)) for i in range(3)]
    results, _ = _reduce(values, "fp32")
    assert all(torch.all(r == 6.0) for r in results)


def _gather(members: list[Gathered]) -> int:
    size = len(members)
    ring = _Ring(size)

    async def run() -> None:
        await asyncio.gather(*(ring_allgather(m, i, size, "g", *ring.ends(i))  # type: ignore[arg-type]
                               for i, m in enumerate(members)))

    asyncio.run(run())
    return ring.sent


@pytest.mark.parametrize("payload", ["top5%", "int8", "int4"])
def test_a_compressed_gradient_payload_is_gathered_and_summed_in_ring_order(
        payload: str) -> None:
    torch.manual_seed(0)
    size, elements = 3, 1000
    values = [torch.randn(elements) for _ in range(size)]
    members = [Gathered(encode(v, payload), elements, payload) for v in values]
    sent = _gather(members)
    expected = torch.zeros(elements)
    for v in values:
        expected += compress(v, payload)
    for member in members:
        assert member.values is not None and torch.equal(member.values, expected)
    assert sent == size * (size - 1) * payload_bytes(elements, payload, 4)


def test_quantized_payloads_are_gathered_and_dense_ones_reduced_in_a_ring() -> None:
    """Quantized once and summed in fp32 after dequantizing: compressed gradients (error
    feedback) and quantized deltas (Streaming DiLoCo's 4-bit outer gradients, section
    2.3: only what is communicated is low precision)."""
    assert Collective(payload="int8").gathers and Collective(payload="top1%").gathers
    assert Collective(payload="int4", scope=Scope.DC).gathers
    for payload in ("int8", "int4", "fp4"):
        assert Collective(Reduces.DELTAS, payload=payload).gathers
    assert Collective(Reduces.DELTAS, payload="top1%").gathers  # pairs never add up
    assert not Collective(payload="bf16").gathers and not Collective().gathers
    assert not Collective(Reduces.DELTAS, payload="bf16").gathers


def test_quantization_is_blockwise_absmax_symmetric_round_to_nearest() -> None:
    values = torch.cat([torch.linspace(-2, 1, 256), torch.zeros(256), torch.tensor([0.5, -3.0])])
    data = encode(values, "int8")
    q = torch.frombuffer(bytearray(data[:514]), dtype=torch.int8)
    scales = torch.frombuffer(bytearray(data[514:]), dtype=torch.float32)
    assert torch.equal(scales, torch.tensor([2.0, 0.0, 3.0]) / 127)
    assert torch.equal(q[:256].float(), torch.round(values[:256] / scales[0]))
    assert int(q[0]) == -127 and int(q[513]) == -127 and int(q[512]) == round(0.5 * 127 / 3)
    assert torch.all(q[256:512] == 0)
    assert torch.equal(decode(data, values.numel(), "int8"), wire(values, "int8"))
    four = decode(encode(values, "int4"), values.numel(), "int4")
    assert torch.equal(four, wire(values, "int4"))
    assert set((four[:256] / (2 / 7)).round().tolist()) <= set(range(-7, 8))


def test_fp4_is_e3m0_a_sign_and_a_power_of_two_of_the_block_s_absmax() -> None:
    """The Streaming DiLoCo paper's 4-bit float: 0 or +-2^-6 ... 2^0 times the block's
    scale, the nearest (a tie to the larger), two to a byte, the bytes the plan counts."""
    ladder = [0.0, 2**-8, 2**-7, 3 * 2**-8, 0.011, 0.375, -0.74, 1.0, -0.0]
    values = torch.tensor(ladder + [0.0] * (256 - len(ladder)) + [5.0, -1.25])
    data = encode(values, "fp4")
    assert len(data) == payload_bytes(values.numel(), "fp4", 2) == 129 + 8
    got = decode(data, values.numel(), "fp4")
    assert got[:9].tolist() == [0.0, 0.0, 2**-6, 2**-6, 2**-6, 0.5, -0.5, 1.0, 0.0]
    assert got[256:].tolist() == [5.0, -5.0 * 2**-2]
    assert torch.equal(got, wire(values, "fp4"))
    nibbles = bytearray(data[:129])
    assert nibbles[0] & 0xF == 0 and nibbles[3] >> 4 == 0b0111  # +1.0: exponent 7
    assert nibbles[3] & 0xF == 0b1110  # -0.5: sign and exponent 6


def test_top_k_takes_the_largest_magnitudes_ties_by_lower_index() -> None:
    values = torch.tensor([1.0, -3.0, 2.0, 3.0, -2.0, 0.5])
    kept = decode(encode(values, "top50%"), 6, "top50%")  # k = 3
    assert kept.tolist() == [0.0, -3.0, 2.0, 3.0, 0.0, 0.0]


def test_ring_chunks_are_whole_quantization_blocks() -> None:
    assert chunk_bounds(3 * 256 + 10, 2, 256) == [(0, 512), (512, 778)]
    assert chunk_bounds(100, 2, 256) == [(0, 0), (0, 100)]


SHAPES = [ModelShape(layers=5, hidden=32, heads=4, seq_len=8, vocab=64),
          ModelShape(layers=4, hidden=32, heads=4, seq_len=8, vocab=64, mlp="swiglu",
                     kv_heads=2),
          ModelShape(layers=4, hidden=32, heads=4, seq_len=8, vocab=64, tied_embeddings=True)]


SPLITS = [(shape, split) for shape in SHAPES
          for split in [(5,), (2, 3), (1, 1, 3), (4,), (2, 2), (1, 3)]
          if sum(split) == shape.layers]


@pytest.mark.parametrize(("shape", "layers"), SPLITS)
@pytest.mark.parametrize("fragments", [1, 2, 3, 4])
def test_each_fragments_weight_matrices_are_the_ones_the_simulator_counts(
        shape: ModelShape, layers: tuple[int, ...], fragments: int) -> None:
    for index, stage in enumerate(build_stages(shape, layers, 0)):
        of = parameter_fragments(stage, layers, index, fragments)
        assert set(of) == {n for n, _ in stage.named_parameters()}
        counted = [0] * fragments
        for name, p in stage.named_parameters():
            matrix = name.endswith("weight") and p.dim() == 2 and not name.startswith("position")
            counted[of[name]] += p.numel() if matrix else 0
        assert counted == [fragment_params(shape, layers, index, k, fragments)
                           for k in range(fragments)]
        for name in of:  # a block's norms and biases go with it
            if name.startswith("blocks."):
                block = sum(layers[:index]) + int(name.split(".")[1])
                assert of[name] == block % fragments


TINY = ModelShape(layers=2, hidden=16, heads=2, seq_len=8, vocab=32)
DELTAS = Collective(Reduces.DELTAS, 0, 2)
DC_DELTAS = Collective(Reduces.DELTAS, 0, 2, scope=Scope.DC)
GRADS = Collective(payload="int8")


def _engine(outer: OuterOptimizer) -> RealEngine:
    me = PeerInfo(0, "east-0", "east")
    config = Config(
        index=0, gpu="east-0", dc="east", address="127.0.0.1", replica=0, stages=[0],
        programs=[["0F0", "0B0", "0STEP"]], cycle=[], neighbours={},
        collectives=[CollectiveSetup(0, str(c), 0, [me, PeerInfo(1, "west-0", "west")])
                     for c in (DELTAS, DC_DELTAS, GRADS)],
        arbitrated=[], iterations=1, compute="real", model=TINY, layers=[2], seed=0, dp=2,
        microbatches=1, microbatch_size=2, activation_bytes=0,
        emulated={}, local_rank=0, outer=outer)
    return real_engines(config)[0]


def _train_once(engine: RealEngine, iteration: int) -> None:
    engine.forward(iteration, 0, None)
    engine.backward(iteration, 0, None)


def _sync(engine: RealEngine) -> None:
    """Gradients with error feedback, an inner step, then a sync of fragment 0, each as if
    the other member's payload were the same (an average of two equal ones)."""
    grads = engine.contribute(GRADS, 0, 2)
    assert isinstance(grads, Gathered)
    grads.gathered([grads.mine, grads.mine])
    engine.reduced(GRADS, grads, 2)
    engine.step()
    deltas = engine.contribute(DELTAS, 0, 2)
    assert isinstance(deltas, Dense)
    deltas.values *= 2
    engine.reduced(DELTAS, deltas, 2)
    engine.outer_step(DELTAS)


def test_error_feedback_keeps_what_compression_lost_and_adds_it_next_time() -> None:
    engine = _engine(OuterOptimizer())
    _train_once(engine, 0)
    exact = torch.cat([p.grad.reshape(-1) for p in engine.module.parameters()])  # type: ignore[union-attr]
    first = engine.contribute(GRADS, 0, 2)
    assert isinstance(first, Gathered) and first.mine == encode(exact, "int8")
    residual = engine.syncs.residuals[GRADS]
    assert torch.equal(residual, exact - wire(exact, "int8")) and residual.abs().sum() > 0
    second = engine.contribute(GRADS, 0, 2)
    assert isinstance(second, Gathered) and second.mine == encode(exact + residual, "int8")


def test_outer_state_and_residuals_survive_a_checkpoint(tmp_path: Path) -> None:
    outer = OuterOptimizer(lr=0.5, momentum=0.9, nesterov=True, mixing=0.25)
    engine = _engine(outer)
    for iteration in range(2):
        _train_once(engine, iteration)
        _sync(engine)
    engine.checkpoint(str(tmp_path / "c.pt"))
    resumed = _engine(outer)
    resumed.restore(str(tmp_path / "c.pt"))
    for e in (engine, resumed):
        _train_once(e, 2)
        _sync(e)
    for (name, a), b in zip(engine.module.state_dict().items(),
                            resumed.module.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for name, value in engine.syncs.outer.items():
        assert torch.equal(value, resumed.syncs.outer[name]), name
    assert not math.isnan(float(engine.syncs.residuals[GRADS].sum()))


def test_an_outer_step_takes_the_last_average_over_all_replicas() -> None:
    """A datacenter's own average of its deltas (two of four replicas) is not what the
    outer step applies."""
    engine = _engine(OuterOptimizer())
    _train_once(engine, 0)
    engine.step()
    everyone = engine.contribute(DELTAS, 0, 2)
    engine.reduced(DELTAS, everyone, 2)
    expected = engine.syncs.averaged[(0, 2)].clone()
    some = engine.contribute(DC_DELTAS, 0, 1)
    assert isinstance(some, Dense)
    some.values += 1.0
    engine.reduced(DC_DELTAS, some, 1)
    assert torch.equal(engine.syncs.averaged[(0, 2)], expected)


def _members_step(syncs: list[Syncs], collective: Collective) -> None:
    """One collective of every member through the worker's own code: each contributes,
    the ring (all-reduce or all-gather, as the collective says) runs, each takes the sum."""
    n = len(syncs)
    members = [s.contribute(collective, n) for s in syncs]
    ring = _Ring(n)
    move = ring_allgather if collective.gathers else ring_allreduce

    async def run() -> None:
        await asyncio.gather(*(move(m, i, n, "t", *ring.ends(i))  # type: ignore[arg-type]
                               for i, m in enumerate(members)))

    asyncio.run(run())
    for s, m in zip(syncs, members, strict=True):
        s.reduced(collective, m, n)


def _gradients(kind: str, n: int, d: int, steps: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    if kind == "constant":
        fixed = [torch.randn(d, generator=generator) for _ in range(n)]
        return [fixed for _ in range(steps)]
    return [[torch.randn(d, generator=generator) for _ in range(n)] for _ in range(steps)]


def _drift(applied: list[torch.Tensor], gradients: list[list[torch.Tensor]]) -> float:
    """The largest element of the cumulative applied update minus the cumulative true
    average, in fp64."""
    total = torch.zeros(applied[0].numel(), dtype=torch.float64)
    for step, grads in zip(applied, gradients, strict=True):
        total += step.double() - sum(g.double() for g in grads) / len(grads)
    return float(total.abs().max())


@pytest.mark.parametrize("kind", ["random", "constant"])
@pytest.mark.parametrize("payload", ["int8", "int4", "top10%"])
def test_error_feedback_keeps_the_applied_updates_within_one_compression_of_the_truth(
        payload: str, kind: str) -> None:
    """EF-SGD's guarantee (Karimireddy et al. 2019): when each member's compression is the
    only error made, what the members applied over T steps is the true sum less the mean
    of their last residuals, whatever T. Through the workers' own code (Syncs, payloads,
    the ring), over 200 steps; a ring that requantizes partial sums at every hop, each
    member keeping only its own quantization's error, drifts far past it."""
    n, d, steps = 3, 1024, 200
    collective = Collective(payload=payload)
    gradients = _gradients(kind, n, d, steps)
    params = [torch.nn.Parameter(torch.zeros(d)) for _ in range(n)]
    syncs = [Syncs([("w", p)], lambda _k: {"w": 0}, None, [collective], n) for p in params]
    applied = []
    for grads in gradients:
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        _members_step(syncs, collective)
        assert all(torch.equal(p.grad, params[0].grad) for p in params)  # type: ignore[arg-type]
        assert params[0].grad is not None
        applied.append(params[0].grad.clone())
    residual = max(float(s.residuals[collective].abs().max()) for s in syncs)
    drift = _drift(applied, gradients)
    assert drift <= residual + 1e-4
    if payload == "top10%":
        return
    # a residual is at most half a quantization step of its block, |p| / 2L, and
    # |p| <= |g| + |e|: so at most |g| / (2L - 1)
    levels = {"int8": 127, "int4": 7}[payload]
    largest = max(float(g.abs().max()) for grads in gradients for g in grads)
    assert residual <= largest / (2 * levels - 1) * (1 + 1e-6)
    assert _per_hop_ring_drift(payload, gradients) > 10 * drift


def _per_hop_ring_drift(payload: str, gradients: list[list[torch.Tensor]]) -> float:
    """The rule compressed gradients once had: a ring all-reduce requantizing partial
    sums at every hop, each member's residual only its own values' quantization error."""
    n = len(gradients[0])
    residuals = [torch.zeros_like(gradients[0][0]) for _ in range(n)]
    applied = []
    for grads in gradients:
        values = []
        for r, g in enumerate(grads):
            v = g + residuals[r]
            residuals[r] = v - wire(v, payload)
            values.append(v)
        applied.append(ring_sum(values, payload) / n)
    return _drift(applied, gradients)
