"""A checkpoint moved to another placement (a run replanned after losing a worker): each
stage's parameters and AdamW state, saved under one plan's split of the layers, written
again under another's. Replicas of a data-parallel plan hold the same state after every
step, so every new replica starts from the first old one's."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from testbed.emulator.runtime.worker.compute.model import build_stages
from testbed.errors import TestbedError
from testbed.job.model import ModelShape
from testbed.run.checkpoint import save_stage, stage_file

_BLOCK = re.compile(r"blocks\.(\d+)\.(.*)")


def _global(name: str, first_block: int) -> str:
    match = _BLOCK.match(name)
    return f"blocks.{first_block + int(match.group(1))}.{match.group(2)}" if match else name


def _local(name: str, first_block: int) -> str:
    match = _BLOCK.match(name)
    return f"blocks.{int(match.group(1)) - first_block}.{match.group(2)}" if match else name


def _parameter_names(shape: ModelShape, layers: tuple[int, ...], seed: int) -> list[list[str]]:
    """Each stage's parameters by name, in the order its optimizer numbers them."""
    return [[name for name, _ in stage.named_parameters()]
            for stage in build_stages(shape, layers, seed)]


def reshard(source: Path, old_layers: tuple[int, ...], target: Path,
            new_layers: tuple[int, ...], replicas: int, shape: ModelShape, seed: int) -> None:
    """Read replica 0's stages under `old_layers` from `source`, write every replica's
    stages under `new_layers` into `target` (as testbed.run.checkpoint names them)."""
    params: dict[str, torch.Tensor] = {}
    moments: dict[str, dict[str, torch.Tensor]] = {}
    groups: list[dict[str, object]] = []
    first = 0
    for stage, names in enumerate(_parameter_names(shape, old_layers, seed)):
        path = stage_file(source, 0, stage)
        try:
            saved = torch.load(path, map_location="cpu")
        except Exception as exc:
            raise TestbedError(f"cannot move the checkpoint to the new plan: {path}: "
                               f"{type(exc).__name__}: {exc}") from None
        if any((saved.get("syncs") or {}).values()):
            raise TestbedError("cannot move a checkpoint with outer optimizer state or "
                               "error-feedback residuals (a DiLoCo or compressed plan's) to "
                               "another placement")
        for name, value in saved["model"].items():
            params[_global(name, first)] = value
        optimizer = saved["optimizer"]
        groups = optimizer["param_groups"]
        for index, name in enumerate(names):
            if index in optimizer["state"]:
                moments[_global(name, first)] = optimizer["state"][index]
        first += old_layers[stage]
    first = 0
    for stage, names in enumerate(_parameter_names(shape, new_layers, seed)):
        model = {name: params[_global(name, first)] for name in names}
        state = {i: moments[_global(name, first)] for i, name in enumerate(names)
                 if _global(name, first) in moments}
        group = {**groups[0], "params": list(range(len(names)))} if groups else {}
        blob = {"model": model, "optimizer": {"state": state, "param_groups": [group]}}
        for replica in range(replicas):
            save_stage(lambda path, b=blob: torch.save(b, path), target, replica, stage)
        first += new_layers[stage]
