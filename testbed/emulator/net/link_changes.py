"""Changing a WAN link while the network runs (network events): rate through tc, delay
and loss through netem or the delay lines."""

from __future__ import annotations

import json
import os
import signal

from testbed.common.fsutil import write_atomic
from testbed.emulator.net import netns as kernel
from testbed.emulator.net.layout import Shape
from testbed.emulator.net.network import Network
from testbed.emulator.net.shaping import Shaper, netem_link, tbf_queue


def change_link(network: Network, a: str, b: str, latency_s: float | None = None,
                bandwidth_bps: float | None = None, loss: float | None = None,
                one_way: bool = False) -> None:
    """Change a WAN link (both directions, or only a->b when `one_way`) while the network
    runs: rate through tc, delay and loss through netem or the delay lines. A machine's
    share of a network across machines changes the directions its own routers send (the
    other machine changes the rest)."""
    link = network.topology.link(a, b)
    here = network.layout.router_dcs
    with kernel.Namespaces() as k:
        for src, dst in ((a, b),) if one_way else ((a, b), (b, a)):
            if src not in here:
                continue
            port = network.layout.port(src, dst)
            ns = network.layout.router(src).netns
            current = network.current.setdefault((src, dst), {
                "delay_s": link.latency_s, "jitter_s": link.jitter_s, "loss": link.loss,
                "bandwidth_bps": link.bandwidth_bps})
            for name, value in (("delay_s", latency_s), ("bandwidth_bps", bandwidth_bps),
                                ("loss", loss)):
                if value is not None:
                    current[name] = value
            shape = Shape(current["bandwidth_bps"], current["delay_s"], current["jitter_s"],
                          current["loss"], link.effective_queue_bytes)
            if network.shaper is Shaper.USERSPACE:
                if bandwidth_bps is not None:
                    (tbf,) = tbf_queue(ns, port.tun, shape)
                    k.qdisc(tbf, command="change")
                _signal_delay_line(network, f"{src}>{dst}", current)
            else:
                for qdisc in netem_link(ns, port.ifname, shape)[1:]:
                    k.qdisc(qdisc, command="change")


def _signal_delay_line(network: Network, key: str, current: dict[str, float]) -> None:
    assert network.stats_dir is not None
    control = network.stats_dir / f"delayline-{key}.control"
    write_atomic(control, json.dumps({k: current[k] for k in ("delay_s", "jitter_s", "loss")}))
    proc = network.delay_lines.get(key)
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, signal.SIGHUP)
