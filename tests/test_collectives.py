"""A collective's math on the worker: rings and gathers of real payloads (quantized ones
requantized at every hop), the quantization and top-k rules of the contract, which
parameters each fragment holds, and error feedback and outer state that survive a
checkpoint."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch

from testbed.job.fragments import fragment_params
from testbed.job.model import ModelShape
from testbed.plan.collective import Collective, Reduces, Scope, payload_bytes
from testbed.plan.model import OuterOptimizer
from testbed.runtime.wire.messages import CollectiveSetup, Config, PeerInfo
from testbed.runtime.worker.allreduce import Wire, chunk_bounds, ring_allgather, ring_allreduce
from testbed.runtime.worker.model import build_stages, parameter_fragments
from testbed.runtime.worker.payloads import Dense, Sparse, decode, encode, topk_decode, topk_encode
from testbed.runtime.worker.real_engine import RealEngine, real_engines
from tests.diloco_reference import ring_sum, wire


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


def test_a_sparse_payload_is_gathered_and_summed_in_ring_order() -> None:
    torch.manual_seed(0)
    size, elements = 3, 1000
    values = [torch.randn(elements) for _ in range(size)]
    members = [Sparse(v.clone(), 0.05) for v in values]
    ring = _Ring(size)

    async def run() -> None:
        await asyncio.gather(*(ring_allgather(m, i, size, "g", *ring.ends(i))  # type: ignore[arg-type]
                               for i, m in enumerate(members)))

    asyncio.run(run())
    expected = torch.zeros(elements)
    for v in values:
        kept = torch.zeros(elements)
        top = sorted(range(elements), key=lambda i, v=v: (-abs(float(v[i])), i))[:50]
        kept[top] = v[top]
        expected += kept
    for member in members:
        assert torch.equal(member.values, expected)
    assert ring.sent == size * (size - 1) * payload_bytes(elements, "top5%", 4)


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


def test_top_k_takes_the_largest_magnitudes_ties_by_lower_index() -> None:
    values = torch.tensor([1.0, -3.0, 2.0, 3.0, -2.0, 0.5])
    kept = topk_decode(topk_encode(values, 0.5), 6)  # k = 3
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
    """Gradients with error feedback, an inner step, then a sync of fragment 0 as if the
    other member's deltas were the same (an average of two equal ones)."""
    grads = engine.contribute(GRADS, 0, 2)
    assert isinstance(grads, Dense)
    grads.values *= 2
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
    assert isinstance(first, Dense) and torch.equal(first.values, exact)
    residual = engine.syncs.residuals[GRADS]
    assert torch.equal(residual, exact - wire(exact, "int8")) and residual.abs().sum() > 0
    second = engine.contribute(GRADS, 0, 2)
    assert isinstance(second, Dense) and torch.equal(second.values, exact + residual)


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
