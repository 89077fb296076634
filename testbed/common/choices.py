"""The closed choices a run is made of, as types: a typo is a type error, not a branch
that is never taken."""

from __future__ import annotations

from typing import Literal, get_args

BackendName = Literal["simulate", "emulate"]
ComputeChoice = Literal["auto", "emulated", "real"]
"""What a user asks for: `auto` takes real compute where there is a GPU per worker."""
EmulatedCompute = Literal["emulated", "real"]
Compute = Literal["emulated", "real", "modeled"]
"""What ran: timed sleeps, torch, or the simulator's FLOP model."""
ShaperChoice = Literal["auto", "netem", "userspace"]
AllReduceChoice = Literal["auto", "real"]
"""`auto` models intra-DC rings in emulated compute; `real` sends every gradient byte."""
ActivationsChoice = Literal["auto", "real"]
"""`auto` models activations inside a DC in emulated compute; `real` sends them."""
Status = Literal["ok", "failed", "interrupted"]
TraceChoice = Literal["full", "summary", "none"]
"""How much of a run the trace draws: every GPU, a summary that a viewer can show at any
scale (testbed.report.chrome), or no trace."""
FigureFormat = Literal["png", "pdf", "svg"]
"""The file format of every figure a command draws (its CSV beside it)."""
OnFailure = Literal["stop", "restart", "replan"]
"""What a run does when a scenario's failure takes a worker: end (as a dead worker ends a
run), go on from the last checkpoint on the same GPUs once the lost one is back, or go
on from it at once on a plan for the GPUs still alive."""
Verbosity = Literal["quiet", "normal", "verbose"]
"""How much a long command shows while it works (testbed.cli.progress): errors, warnings
and its results alone; its own progress too; and each run's own lines as well."""


def values_of(choice: object) -> list[str]:
    """A Literal type's values, in order: what a command-line choice offers, so a new value
    is written once, in its type."""
    return list(get_args(choice))
