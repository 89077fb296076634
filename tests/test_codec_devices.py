"""Where the collectives' codec and a stage's syncs keep their tensors when training runs
on an accelerator: on the parameters' device, crossing to the host only at the bytes on
the wire (and for DiLoCo's outer state, which lives in host memory). Checked on CUDA
where there is one, and everywhere with a stand-in device (tests/emulated_device.py)
that refuses what CUDA refuses; the numbers must be the host's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from testbed.emulator.runtime.worker.collectives.payloads import (
    Dense,
    Gathered,
    compressed,
    decode,
    encode,
)
from testbed.emulator.runtime.worker.collectives.syncs import Syncs
from testbed.plan.collective import Collective, Reduces
from testbed.plan.model import OuterOptimizer
from tests.emulated_device import DEVICE, HOST, EmulatedDevice

PAYLOADS = ["fp32", "bf16", "int8", "int4", "top10%"]


@pytest.fixture(params=["stand-in", "cuda"])
def placed(request: pytest.FixtureRequest) -> Iterator[contextlib.AbstractContextManager[object]]:
    """Where the tensors go: the stand-in device, or a real GPU."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device; this machine has none (the stand-in runs here)")
    yield EmulatedDevice() if request.param == "stand-in" else contextlib.nullcontext()


def on_host(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's numbers as a host tensor, from the stand-in device or a GPU."""
    return tensor.as_subclass(torch.Tensor).cpu()


def test_the_stand_in_device_refuses_what_cuda_refuses() -> None:
    with EmulatedDevice():
        values = torch.randn(300).to(DEVICE)
        assert values.device == DEVICE and (values * 2).device == DEVICE
        with pytest.raises(RuntimeError, match="same device"):
            _ = values - torch.zeros(300)
        with pytest.raises(TypeError, match="numpy"):
            values.numpy()
        assert values.cpu().device == HOST and (values + torch.tensor(1.0)).device == DEVICE


@pytest.mark.parametrize("payload", PAYLOADS)
def test_the_codec_works_on_the_values_device_and_crosses_only_at_the_bytes(
        payload: str, placed: contextlib.AbstractContextManager[object]) -> None:
    torch.manual_seed(0)
    host = torch.randn(1000)
    with placed:
        values = host.to(DEVICE)
        data = encode(values, payload)
        read = decode(data, 1000, payload, values.device)
        same = compressed(values, payload)
        received = decode(data, 1000, payload)
        assert read.device == DEVICE and same.device == DEVICE and received.device == HOST
    assert data == encode(host, payload)
    assert torch.equal(on_host(read), compressed(host, payload))
    assert torch.equal(on_host(same), on_host(read)) and torch.equal(received, on_host(read))


def _members(collective: Collective, outer: OuterOptimizer | None = None
             ) -> tuple[list[torch.nn.Parameter], list[Syncs]]:
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(700).to(DEVICE)) for _ in range(2)]
    syncs = [Syncs([("w", p)], lambda _k: {"w": 0}, outer, [collective], 2) for p in params]
    return params, syncs


@pytest.mark.parametrize("payload", ["int8", "int4", "top10%"])
def test_compressed_gradients_take_their_residuals_and_averages_on_the_device(
        payload: str, placed: contextlib.AbstractContextManager[object]) -> None:
    """dp-compressed's step with the gradients on the device: residuals stay there, the
    averaged gradient arrives there (each member as if the other sent what it did)."""
    collective = Collective(payload=payload)
    with placed:
        params, syncs = _members(collective)
        for _step in range(2):
            for p in params:
                p.grad = torch.randn(700).to(DEVICE)
            joined = [s.contribute(collective, 2) for s in syncs]
            assert all(isinstance(j, Gathered) for j in joined)
            sent = [j.mine for j in joined if isinstance(j, Gathered)]
            for s, j in zip(syncs, joined, strict=True):
                assert isinstance(j, Gathered)
                j.gathered(sent)
                s.reduced(collective, j, 2)
            assert all(s.residuals[collective].device == DEVICE for s in syncs)
            assert all(p.grad is not None and p.grad.device == DEVICE for p in params)


def test_deltas_and_the_outer_step_keep_the_outer_state_in_host_memory(
        placed: contextlib.AbstractContextManager[object]) -> None:
    """Each member's own deltas (no ring here), an outer step, and the mixing back into
    the parameters on the device."""
    deltas = Collective(Reduces.DELTAS)
    with placed:
        params, syncs = _members(deltas, OuterOptimizer(mixing=0.5))
        for p in params:
            with torch.no_grad():
                p.sub_(0.1)
        before = [on_host(p).detach().clone() for p in params]
        joined = [s.contribute(deltas, 2) for s in syncs]
        assert all(isinstance(j, Dense) and j.values.device == HOST for j in joined)
        for s, j in zip(syncs, joined, strict=True):
            s.reduced(deltas, j, 2)
            s.outer_step(deltas)
        assert all(value.device == HOST for s in syncs for value in s.outer.values())
        assert all(p.device == DEVICE for p in params)
    for p, s, was in zip(params, syncs, before, strict=True):
        assert torch.equal(on_host(p).detach(), 0.5 * was + 0.5 * s.outer["w"])
