"""Atlas's settings: each field an option (`-o order=fifo`), with its default, help and
parser; the ablations pin some of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast, get_args

from testbed.policy.api import non_negative_int, on_off, one_of, setting

from .search import Mode

ORDERS = ("pipeline", "microbatch", "fifo")


def _mode(text: str) -> Mode:
    return cast(Mode, one_of(*get_args(Mode))(text))


@dataclass(frozen=True)
class AtlasSettings:
    connections: int = setting(0, "TCP connections per cross-DC peer pair (0: enough to fill "
                               "the link from its bandwidth-delay product and the TCP window)",
                               non_negative_int)
    max_connections: int = setting(0, "upper bound when chosen automatically (0: what the "
                                   "path needs, within the hosts' open-file and TCP-memory "
                                   "limits)", non_negative_int)
    temporal: bool = setting(True, "temporal WAN sharing: one transfer at a time per link "
                             "direction and DP-cell, in a workload-aware order (on/off)", on_off)
    order: str = setting("microbatch", "who gets the link next: microbatch (the transfer its "
                         "receiver needs soonest), pipeline (lowest replica first), fifo",
                         one_of(*ORDERS))
    selection: bool = setting(True, "choose DCs and the DP/PP split by predicted throughput "
                              "(off: every DC, largest first)", on_off)
    search: Mode = setting("staged", "staged: rank by the closed form and simulate the "
                           "promising plans; grid: simulate every DC subset, dp, pp and "
                           "schedule; exhaustive: and each with every mechanism (slow; "
                           "ground truths)", _mode)
    warm: bool = setting(True, "keep windows open between turns on a link: the plan asks its "
                         "hosts for slow start after idle off (on/off)", on_off)
    two_per_gpu: bool = setting(True, "also try torch's interleaved 1F1B and zero-bubble "
                                "orders over two stages per GPU where they fit, for the best "
                                "placements (on/off; off plans without importing torch)",
                                on_off)
