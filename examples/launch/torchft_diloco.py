"""DiLoCo with torchft 0.2.0, as torchft's documentation runs it: a lighthouse that forms
the quorum of replica groups, a Manager per replica group (its ProcessGroupGloo across
the groups), and torchft.local_sgd.DiLoCo wrapping the model's inner optimizer, which
all-reduces the pseudo-gradients every `--sync-every` steps and takes an outer Nesterov
step. Each process is one replica group of one rank: it hosts its group's store, as
torchrun does for a group, and rank 0 also starts the lighthouse (`torchft_lighthouse`).
The groups wait for each other once, at the start, on a store at MASTER_ADDR.

A replica group that dies is left out of the next quorum; the others go on (min replicas
1). Around each sync the program waits a moment with nothing of its own on the network
and reports when (`TESTBED_METRIC` lines: `sync_begin`, `sync_end`), and how many bytes a
sync all-reduces (`payload_bytes`: every parameter, fp32).

    testbed launch topologies/two-dc.yaml -p examples/launch/one-per-dc.yaml -- \
        python examples/launch/torchft_diloco.py
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed import TCPStore
from torchft import Manager, ProcessGroupGloo
from torchft.local_sgd import DiLoCo

LIGHTHOUSE_PORT = 29510
QUIET_S = 0.6
"""Seconds with nothing of this program's on the network around each sync, its mark in
the middle (a sampler of link counters every 0.2 s then sees the sync whole)."""


def metric(**values: object) -> None:
    print("TESTBED_METRIC " + json.dumps({"time": time.time(), **values}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--syncs", type=int, default=4)
    parser.add_argument("--sync-every", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--store-port", type=int, default=29520)
    args = parser.parse_args()

    rank, groups = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    master = os.environ["MASTER_ADDR"]
    address = socket.gethostbyname(os.environ.get("TESTBED_HOST", "localhost"))
    lighthouse = None
    if rank == 0:
        lighthouse = subprocess.Popen([
            str(Path(sys.executable).with_name("torchft_lighthouse")), "--min_replicas", "1",
            "--bind", f"[::]:{LIGHTHOUSE_PORT}", "--join_timeout_ms", "3000",
            "--quorum_tick_ms", "100", "--heartbeat_timeout_ms", "2000"])
    store = TCPStore(address, args.store_port, 1, is_master=True, wait_for_workers=False)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, args.width))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    def load_state_dict(state: dict[str, dict[str, object]]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1,
        load_state_dict=load_state_dict, state_dict=state_dict, use_async_quorum=False,
        replica_id=f"group{rank}", store_addr=address, store_port=args.store_port, rank=0,
        world_size=1, lighthouse_addr=f"http://{master}:{LIGHTHOUSE_PORT}",
        hostname=address, timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=30), connect_timeout=timedelta(seconds=30))
    # every group's manager up (heartbeating) before the first quorum, as torchrun's
    # rendezvous would hold them; from then on the lighthouse decides who is in
    try:
        start = TCPStore(master, int(os.environ["MASTER_PORT"]), groups,
                         is_master=rank == 0, wait_for_workers=True,
                         timeout=timedelta(seconds=60))
    except torch.distributed.DistStoreError as exc:  # a group lost before it began
        print(f"starting without every group: {exc}", flush=True)
        start = None
    payload = sum(p.numel() * p.element_size() for p in model.parameters())
    metric(payload_bytes=payload, groups=groups)
    data = torch.Generator().manual_seed(rank)
    step = 0
    try:
        with DiLoCo(manager, [model], inner, outer, sync_every=args.sync_every):
            while manager.current_step() < args.syncs:
                x = torch.randn(32, args.width, generator=data)
                inner.zero_grad()
                loss = (model(x) - x).pow(2).mean()
                loss.backward()
                syncing = (step + 1) % args.sync_every == 0
                if syncing:
                    time.sleep(QUIET_S / 2)
                    metric(sync_begin=manager.current_step())
                    time.sleep(QUIET_S / 2)
                inner.step()
                if syncing:
                    time.sleep(QUIET_S / 2)
                    metric(sync_end=manager.current_step(),
                           participants=manager.num_participants())
                    time.sleep(QUIET_S / 2)
                metric(step=step, loss=loss.item(), tokens=32)
                step += 1
    finally:
        manager.shutdown(wait=False)
        del store, start
        if lighthouse is not None:
            lighthouse.terminate()
            lighthouse.wait()


if __name__ == "__main__":
    main()
