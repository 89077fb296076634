"""Pipeline-parallel training with torch's own pipelining API, as torch's documentation
shows it (torch.distributed.pipelining: a model split into stages by hand, one
PipelineStage per rank, a GPipe or 1F1B schedule), on gloo: a standalone program that
knows nothing of testbed. It reads the environment any torch launcher sets (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and prints one `TESTBED_METRIC` line per step,
which `testbed launch` collects (any other launcher shows it as output).

    torchrun --nproc-per-node 4 pipeline.py --steps 5
    testbed launch topologies/two-dc.yaml -- python examples/launch/pipeline.py
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe


class Stage(nn.Module):
    """A decoder-only transformer's layers [first, last); the first stage embeds the
    tokens, the last projects to the vocabulary."""

    def __init__(self, args: argparse.Namespace, index: int, stages: int) -> None:
        super().__init__()
        per = [args.layers // stages + (i < args.layers % stages) for i in range(stages)]
        self.embed = nn.Embedding(args.vocab, args.hidden) if index == 0 else None
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(args.hidden, args.heads, 4 * args.hidden, dropout=0.0,
                                       batch_first=True, norm_first=True)
            for _ in range(per[index]))
        self.head = nn.Linear(args.hidden, args.vocab) if index == stages - 1 else None
        self.mask = nn.Transformer.generate_square_subsequent_mask(args.seq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = layer(x, src_mask=self.mask, is_causal=True)
        return self.head(x) if self.head is not None else x


def metric(**values: object) -> None:
    print("TESTBED_METRIC " + json.dumps({"time": time.time(), **values}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--microbatch-size", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed + rank)
    stage = PipelineStage(Stage(args, rank, world), rank, world, torch.device("cpu"))
    loss_fn = nn.CrossEntropyLoss()
    schedule_of = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[args.schedule]
    schedule = schedule_of(stage, args.microbatches,
                           loss_fn=lambda out, y: loss_fn(out.flatten(0, 1), y.flatten()))
    optimizer = torch.optim.AdamW(stage.submod.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(args.seed)
    batch = args.microbatches * args.microbatch_size
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (batch, args.seq + 1), generator=data)
        x, y = tokens[:, :-1], tokens[:, 1:]
        started = time.perf_counter()
        optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        optimizer.step()
        took = time.perf_counter() - started
        if rank == world - 1:
            loss = torch.stack(losses).mean().item()
            metric(step=step, loss=loss, tokens=batch * args.seq, step_s=took)
        else:
            metric(step=step, step_s=took)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
