"""Whether gloo sends a message before its receiver has posted the receive: rank 0 posts
four sends of 16 KiB at once, rank 1 receives them one after another; eager sends arrive
in about one one-way latency, sends that wait for each receive take a round trip each.
Run by scripts/bench_launch.py under `testbed launch` (one rank per DC)."""

import json
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
message = torch.zeros(4096)
for trial in range(3):
    dist.barrier()
    started = time.perf_counter()
    if rank == 0:
        for work in [dist.isend(message, 1) for _ in range(4)]:
            work.wait()
    else:
        for _ in range(4):
            dist.recv(message, 0)
    print("TESTBED_METRIC " + json.dumps({"step": trial,
                                          "four_messages_s": time.perf_counter() - started}),
          flush=True)
dist.barrier()
