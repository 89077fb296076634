"""Data-parallel training with torch's DistributedDataParallel and its fp16 gradient
compression hook (torch.distributed.algorithms.ddp_comm_hooks.default_hooks.
fp16_compress_hook), as torch's documentation registers it, on gloo. A standalone program:
any torch launcher starts it. Before and after its steps it waits a second with nothing
on the network, and it reports, as `TESTBED_METRIC` lines, when its steps began and ended
and how many bytes the hook hands to the all-reduce each step (every gradient, in fp16),
so that what crossed the WAN during the steps can be held against the hook's payload.

    testbed launch topologies/two-dc.yaml -p examples/launch/one-per-dc.yaml -- \
        python examples/launch/ddp_fp16.py
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

QUIET_S = 1.0


def metric(**values: object) -> None:
    print("TESTBED_METRIC " + json.dumps({"time": time.time(), **values}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = DistributedDataParallel(nn.Sequential(*layers))
    model.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
    payload = sum(p.numel() for p in model.parameters() if p.requires_grad) * 2
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank)
    dist.barrier()
    time.sleep(QUIET_S / 2)
    metric(phase=0, hook_payload_bytes=payload)
    time.sleep(QUIET_S / 2)
    for step in range(args.steps):
        x = torch.randn(args.batch, args.width, generator=data)
        started = time.perf_counter()
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        metric(step=step, loss=loss.item(), step_s=time.perf_counter() - started,
               tokens=args.batch)
    # let the last all-reduce's bytes land before saying the steps ended
    time.sleep(QUIET_S / 2)
    metric(phase=1)
    time.sleep(QUIET_S / 2)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
