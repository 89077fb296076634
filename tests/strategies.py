"""Composable hypothesis strategies for topologies, jobs and plans."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from testbed.job.model import Job, ModelShape
from testbed.topology.model import (
    BUILTIN_GPU_TYPES,
    Datacenter,
    TcpSettings,
    Topology,
    WanLink,
)

DC_NAMES = ["east", "west", "central", "north", "south", "eu1", "asia2", "dc7"]

durations = st.sampled_from([0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.1, 0.15])
rates = st.sampled_from([1e8, 5e8, 1e9, 2.5e9, 1e10, 1e11])


@st.composite
def tcp_settings(draw: st.DrawFn) -> TcpSettings:
    high = draw(st.sampled_from([1, 4, 6, 32])) * 1024**2
    return TcpSettings(
        congestion=draw(st.sampled_from(["bbr", "cubic", "reno"])),
        rmem=(4096, 131072, max(high, 131072)),
        wmem=(4096, 16384, high),
        slow_start_after_idle=draw(st.booleans()),
    )


@st.composite
def topologies(
    draw: st.DrawFn, min_dcs: int = 1, max_dcs: int = 4, max_gpus: int = 6, full_mesh: bool = False
) -> Topology:
    names = draw(
        st.lists(st.sampled_from(DC_NAMES), min_size=min_dcs, max_size=max_dcs, unique=True)
    )
    dcs = tuple(
        Datacenter(
            name=name,
            gpus=draw(st.integers(1, max_gpus)),
            gpu=draw(st.sampled_from(sorted(BUILTIN_GPU_TYPES.values(), key=lambda g: g.name))),
            bandwidth_bps=draw(rates),
            latency_s=draw(st.sampled_from([0.0, 5e-6, 5e-5])),
            tcp=draw(st.none() | tcp_settings()),
        )
        for name in names
    )
    links = []
    for i, name in enumerate(names[1:], start=1):
        # a spanning tree keeps every DC reachable; optional extra links make meshes
        peers = names[:i] if full_mesh else [draw(st.sampled_from(names[:i]))]
        if not full_mesh:
            peers += [p for p in names[:i] if p not in peers and draw(st.booleans())]
        for peer in peers:
            latency = draw(durations)
            links.append(
                WanLink(
                    a=peer,
                    b=name,
                    latency_s=latency,
                    bandwidth_bps=draw(rates),
                    jitter_s=draw(st.sampled_from([0.0, latency / 10])),
                    loss=draw(st.sampled_from([0.0, 0.001, 0.01])),
                    queue_bytes=draw(st.none() | st.sampled_from([65536, 1024**2, 8 * 1024**2])),
                )
            )
    return Topology(
        draw(st.sampled_from(["t", "topo-1", "my.net"])), dcs, tuple(links), draw(tcp_settings())
    )


@st.composite
def jobs(draw: st.DrawFn, max_layers: int = 12) -> Job:
    heads = draw(st.sampled_from([1, 2, 4]))
    model = ModelShape(
        layers=draw(st.integers(1, max_layers)),
        hidden=heads * draw(st.sampled_from([8, 16])),
        heads=heads,
        seq_len=draw(st.sampled_from([8, 16, 64])),
        vocab=draw(st.sampled_from([32, 256])),
    )
    return Job(
        model=model,
        microbatch_size=draw(st.integers(1, 4)),
        microbatches=draw(st.integers(1, 12)),
        iterations=draw(st.integers(1, 3)),
        seed=draw(st.integers(0, 2**16)),
    )


def job_fitting(topology: Topology) -> st.SearchStrategy[Job]:
    """Jobs whose default degrees fit the topology (pp no larger than layers)."""

    @st.composite
    def build(draw: st.DrawFn) -> Job:
        job = draw(jobs())
        pp = draw(st.none() | st.integers(1, min(job.model.layers, topology.total_gpus)))
        return Job(**{**job.__dict__, "pp": pp})

    return build()


def mutations() -> st.SearchStrategy[Any]:
    """Values that break a rule wherever they land."""
    return st.sampled_from(
        [
            None,
            -1,
            -5.0,
            "",
            "x",
            "-40ms",
            "abc",
            [],
            {},
            True,
            "1e400ms",
            "40 lightyears",
            0,
            "NaN",
            float("nan"),
        ]
    )
