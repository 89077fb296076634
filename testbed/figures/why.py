"""One sentence per claim, computed from the runs behind its figure, of what bounds that
figure: a baseline's utilization bounding any speed-up on its GPUs at 1/u, one
connection's share of a link bounding what more connections gain, the idle time a plan
leaves to fill. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from testbed.figures.claims import SPEEDUPS

Runs = Mapping[str, Mapping[str, Any]]
"""A claim's runs as claims.json has them: each run's figures by its key."""

NO_SLOWDOWN = 5e-4
"""A slowdown below 0.05% is none: what a run's last digits hold."""


def why(claim_id: str, runs: Runs, target: float | None) -> str | None:
    """What bounds the claim's figure, from its runs; None when they hold too little."""
    base = claim_id.partition(":")[0]
    try:
        if base in SPEEDUPS:
            fast, slow = SPEEDUPS[base]
            return _speedup(runs, fast, slow, target)
        return _OTHERS[base](runs, target) if base in _OTHERS else None
    except (KeyError, TypeError, ZeroDivisionError):
        return None  # a run without the figures the sentence needs


def _pct(value: float) -> str:
    return f"{value:.1%}"


def _rate(bps: float) -> str:
    return f"{bps / 1e9:.3g} Gbit/s"


def _speedup(runs: Runs, fast: str, slow: tuple[str, ...], target: float | None) -> str:
    """tokens/s is GPUs x utilization x the tokens a GPU-second of compute makes, the same
    for every plan of one model, so a plan is at most G_fast / (u_slow x G_slow) times
    faster than the baseline: 1/u on as many GPUs."""
    base = max(slow, key=lambda k: runs[k]["tokens_per_s"] or 0.0)
    u_s, g_s = runs[base]["utilization_training"], runs[base]["gpus"]
    u_f, g_f = runs[fast]["utilization_training"], runs[fast]["gpus"]
    bound = g_f / (u_s * g_s)
    text = (f"{base} keeps its {g_s} GPUs busy {_pct(u_s)} of the time, which bounds any "
            f"plan on {g_f} GPUs at {bound:.2f}x; {fast} keeps its {g_f} busy {_pct(u_f)} "
            f"({runs[fast]['plan']})")
    if target is not None and bound < target:
        text += (f"; {target:g}x needs a baseline busy {g_f / (target * g_s):.1%} of the "
                 "time or less")
    return text


def _multi_tcp(runs: Runs, target: float | None) -> str:
    """The transfer takes propagation plus its bytes at the flows' rate; more connections
    speed up only the second part, and only while one leaves the link short."""
    t = runs["transfer"]
    bits, one_way, n = t["bytes"] * 8, t["one_way_s"], t["connections"]
    one_rate = bits / (t["one_connection_s"] - one_way)
    many_rate = bits / (t["many_connections_s"] - one_way)
    share = one_way / t["many_connections_s"]
    return (f"one connection moves {_rate(one_rate)} of the "
            f"{_rate(t['bandwidth_bps'])} link ({t['window_bytes'] / 2**20:g} MiB "
            f"window over a {2 * one_way * 1e3:g} ms round trip), {n} move "
            f"{_rate(many_rate)}: at most {many_rate / one_rate:.1f}x on the bytes, "
            f"and the {one_way * 1e3:g} ms of propagation both pay is {share:.0%} of the "
            f"{t['bytes'] / 1e6:.0f} MB transfer with {n}")


def _weak_scaling(runs: Runs, target: float | None) -> str:
    counts = sorted(int(k.partition("=")[2]) for k in runs if k.startswith("dcs="))
    one, last = runs[f"dcs={counts[0]}"], runs[f"dcs={counts[-1]}"]
    n = counts[-1]
    busy = last["gpus"] * last["utilization_training"]
    alone = one["gpus"] * one["utilization_training"]
    return (f"with {n} DCs Atlas trains on {last['gpus']} GPUs busy "
            f"{_pct(last['utilization_training'])} ({last['plan']}), against {one['gpus']} "
            f"busy {_pct(one['utilization_training'])} in one DC: {n} DCs keep "
            f"{busy / alone:.2f} times one DC's GPUs busy, not {n}")


def _idle(runs: Runs, target: float | None) -> str:
    atlas = runs["atlas"]
    wan = atlas.get("wan_utilization")
    return (f"Atlas's plan ({atlas['plan']}) keeps its GPUs computing "
            f"{_pct(atlas['utilization_training'])} of the time; the rest they wait for "
            "activations, gradients and all-reduces across the WAN"
            + (f" (its links busy {_pct(wan)})" if wan is not None else ""))


def _utilization(runs: Runs, target: float | None) -> str:
    """Prefills take GPU time (points of utilization), not a share of the idle time."""
    run = runs["bubbletea"]
    u_train, u_total, r = run["utilization_training"], run["utilization_total"], run["requests"]
    pending = r["arrived"] - r["served"] - r["rejected"]
    text = (f"Atlas's plan leaves {_pct(1 - u_train)} of GPU time idle and prefills take "
            f"{_pct(u_total - u_train)} of GPU time, serving {r['served']} of {r['arrived']} "
            f"requests ({r['rejected']} rejected at the deadline, {pending} still waiting "
            "when the run ended)")
    if r["rejected"] or pending:
        return text + (f": requests were waiting, so the {_pct(1 - u_total)} left are "
                       "bubbles too short for the guard and a prefill")
    return text + ": every request found a bubble, so the load, not the bubbles, bounds it"


def _slowdown(runs: Runs, target: float | None) -> str:
    """Filling costs training where a prefill overruns its bubble, or where keeping room
    for the inference model changes the plan; anything else is what prefills share with
    training besides GPU time (their KV caches leave on the GPUs' links)."""
    filled, alone = runs["bubbletea"], runs["none"]
    r = filled["requests"]
    prefills, overran = r.get("prefills") or 0, r.get("overran") or 0
    text = f"{overran} of {prefills} prefills overran their bubble"
    if alone["tokens_per_s"] <= filled["tokens_per_s"] * (1 + NO_SLOWDOWN):
        return text + f", so training ran as without them ({alone['plan']})"
    if filled["plan"] != alone["plan"]:
        return text + (f", and room for the inference model made Atlas plan {filled['plan']} "
                       f"instead of {alone['plan']}")
    if not overran:
        return text + (", on the same plan: training is slowed only by what prefills share "
                       "with it besides GPU time (their KV caches leave on the GPUs' links)")
    return text + f" and held training up, on the same plan ({alone['plan']})"


_OTHERS: Mapping[str, Callable[[Runs, float | None], str]] = {
    "multi_tcp": _multi_tcp, "weak_scaling": _weak_scaling, "bubbles_after_atlas": _idle,
    "bubbletea_utilization": _utilization, "bubbletea_slowdown": _slowdown,
}
