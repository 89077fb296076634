"""The documentation's measured tables whose benchmark script prints no table of its own
in the pages' form: each function takes the loaded JSON file(s) and returns the Markdown
table (scripts/docs_tables.py puts it between its page's markers)."""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

from testbed.common.units import human_bytes, human_rate, parse_rate, parse_size
from testbed.metrics.interval import Interval


def _rate(text: str) -> str:
    """`100Mbit` as `100 Mbit/s`."""
    match = re.fullmatch(r"([\d.]+)([KMG]bit)", text)
    return f"{match.group(1)} {match.group(2)}/s" if match else text


def _rows(header: str, rows: list[str]) -> str:
    columns = header.count("|") - 1
    return "\n".join([header, "| " + " | ".join("---" for _ in range(columns)) + " |", *rows])


def net_rtt(report: dict[str, Any]) -> str:
    """Round trips through the userspace shaper against the configured ones."""
    return _rows("| one-way latency | configured RTT | median RTT | min RTT | p99 RTT |", [
        f"| {r['one_way_ms']:g} ms | {r['rtt_configured_ms']:g} ms | {r['median_ms']:.2f} ms "
        f"| {r['min_ms']:.2f} ms | {r['p99_ms']:.2f} ms |" for r in report["rtt"]])


def net_throughput(report: dict[str, Any]) -> str:
    """One flow and eight through a 100 ms round trip, and the delay lines' CPU."""
    return _rows("| rate (100 ms RTT) | 1 flow | 8 flows | 8 flows / rate | delay-line CPU |", [
        f"| {_rate(r['rate'])} | {r['one_flow_gbps']:.3f} Gbit/s | {r['8_flows_gbps']:.3f} "
        f"Gbit/s | {r['of_rate']:.1%} | {r['delay_line_cpu_s_per_gbit']:.2g} cores per "
        "Gbit/s |" for r in report["throughput_100ms_rtt"]])


def cluster_net(report: dict[str, Any]) -> str:
    """Each WAN link on one machine and across machines: RTT and iperf3 rates (Gbit/s)."""
    one, many = report["one_machine"]["links"], report["cluster"]["links"]
    return _rows("| link | RTT configured | one machine | across machines | rate | 4 flows: one "
                 "machine | across machines | 8 flows: one machine | across machines |", [
        f"| {name} | {link['configured_rtt_ms']:.1f} ms | {link['rtt_ms']:.2f} ms | "
        f"{many[name]['rtt_ms']:.2f} ms | {link['configured_bps'] / 1e9:g} | "
        f"{link['rate_bps'] / 1e9:.3f} | {many[name]['rate_bps'] / 1e9:.3f} | "
        f"{link['rate_8_bps'] / 1e9:.3f} | {many[name]['rate_8_bps'] / 1e9:.3f} |"
        for name, link in one.items()])


def transport(rows: list[dict[str, Any]]) -> str:
    """Goodput of one 128 MiB message by round trip and connections (Gbit/s)."""
    counts = sorted({r["connections"] for r in rows})
    rtts = sorted({r["rtt_ms"] for r in rows})
    by = {(r["rtt_ms"], r["connections"]): r["median_gbps"] for r in rows}
    header = "| RTT | " + " | ".join(f"{c} connection" if c == 1 else str(c)
                                     for c in counts) + " |"
    return _rows(header, [
        f"| {rtt:g} ms | " + " | ".join(
            "-" if (rtt, c) not in by else
            f"{by[rtt, c]:.2f}" + (" Gbit/s" if i == 0 else "") for i, c in enumerate(counts))
        + " |" for rtt in rtts])


def _range(seconds: float, spread: list[float]) -> str:
    return f"{seconds:.3f} s ({spread[0]:.2f}-{spread[1]:.2f})"


def transport_pacing(rows: list[dict[str, Any]]) -> str:
    """One 21 MB message, fresh and warm, paced and not, against iperf3."""
    return _rows("| slow start after idle | connections | iperf3 -P N, fresh | ours fresh, "
                 "unpaced | ours fresh, paced | ours warm, unpaced | ours warm, paced |", [
        f"| {'on' if r['slow_start_after_idle'] else 'off'} | {r['connections']} | "
        f"{r['iperf3_fresh_s']:.3f} s | {r['fresh_unpaced_s']:.3f} s | "
        f"{r['fresh_paced_s']:.3f} s | {_range(r['warm_unpaced_s'], r['warm_unpaced_range_s'])}"
        f" | {_range(r['warm_paced_s'], r['warm_paced_range_s'])} |" for r in rows])


def cluster_run(*reports: dict[str, Any]) -> str:
    """Training across namespace machines against one machine and the simulator, one
    report per split of the DCs over machines (median of runs, each run's median in
    brackets when there are several)."""

    def spread(block: dict[str, Any]) -> str:
        medians = [r["median_s"] for r in block["runs"]]
        inside = f" ({min(medians):.2f}-{max(medians):.2f})" if len(medians) > 1 else ""
        return f"{block['median_s']:.3f} s{inside}"

    def setup(block: dict[str, Any]) -> str:
        return f"{statistics.median(r['setup_s'] for r in block['runs']):.1f} s"

    rows = []
    for report in reports:
        for row in report["rows"]:
            one, many, sim = row["one_machine"], row["across"], row["simulated_s"]
            rows.append(f"| {len(report['machines'])} | {row['policy']} | {sim:.3f} s | "
                        f"{spread(one)} | {spread(many)} | "
                        f"{many['median_s'] / one['median_s']:.3f} | "
                        f"{many['median_s'] / sim:.3f} | {setup(one)} | {setup(many)} |")
    return _rows("| machines | policy | simulated | one machine | across machines | across / "
                 "one | across / simulated | setup: one machine | across machines |", rows)


def _seconds(value: float) -> str:
    """Three significant digits, two decimals below a second: 0.43 s, 1.96 s, 26.3 s."""
    return f"{value:.2f} s" if value < 1 else f"{value:#.3g} s"


def sim_speed(report: dict[str, Any]) -> str:
    """CPU time of one simulated iteration by GPUs and microbatches (wall time where a
    run recorded no CPU time): what the simulator spends, without the time this shared
    machine's other work took from it."""
    rows = report["scale"]
    counts = sorted({r["microbatches"] for r in rows})
    by = {(r["gpus"], r["microbatches"]): r.get("cpu_s", r["wall_s"]) for r in rows}
    return _rows("| GPUs | " + " | ".join(f"{m} microbatches" for m in counts) + " |", [
        f"| {gpus:,} | " + " | ".join(f"{by[gpus, m]:.2f} s" if (gpus, m) in by else "not run"
                                      for m in counts) + " |"
        for gpus in sorted({r["gpus"] for r in rows})])


def sim_e2e(report: dict[str, Any]) -> str:
    """`testbed simulate` end to end beside the simulator's core: the best round (by wall
    time) of each size, and the CPU ratio of the other rounds."""
    sizes: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in report["e2e"]:
        sizes.setdefault((row["gpus"], row["microbatches"]), []).append(row)
    lines = []
    for (gpus, microbatches), rounds in sizes.items():
        best = min(rounds, key=lambda r: r["e2e_s"])
        others = [r["cpu_ratio"] for r in rounds if r is not best]
        spread = sorted({f"{ratio:.1f}" for ratio in others}, key=float)
        other = f" ({spread[0]}-{spread[-1]}x)" if len(spread) > 1 else \
            f" ({spread[0]}x)" if spread else ""
        lines.append(f"| {gpus:,} x {microbatches} | {_seconds(best['e2e_s'])} | "
                     f"{_seconds(best['e2e_cpu_s'])} | {_seconds(best['core_cpu_s'])} | "
                     f"{best['cpu_ratio']:.1f}x{other} |")
    table = _rows("| GPUs x microbatches | `testbed simulate`, wall | CPU | core, CPU | CPU "
                  "ratio (other rounds) |", lines)
    best = {gpus: min(rounds, key=lambda r: r["e2e_s"])
            for (gpus, microbatches), rounds in sizes.items()
            if microbatches == 8 and gpus >= 4096}
    if len(best) < 2:
        return table

    def growth(key: str) -> float:
        return statistics.linear_regression([math.log(g) for g in best],
                                            [math.log(r[key]) for r in best.values()]).slope

    return (f"{table}\n\nFrom {min(best):,} to {max(best):,} GPUs at 8 microbatches, the "
            f"best rounds' wall time grows as GPUs^{growth('e2e_s'):.2f} and their CPU time "
            f"as GPUs^{growth('e2e_cpu_s'):.2f}.")


def sim_e2e_searched(report: dict[str, Any]) -> str:
    """Atlas at scale and BubbleTea on paper-3dc end to end: the first run (which searches
    Atlas's plan) and the same run again (which reads the search back), every round; where
    the bench ran a reference commit in turn (`--against`), its rows too, and each round's
    wall time over the reference's in the same round."""
    cases = (("atlas_e2e", "Atlas, GPT-3 on {gpus:,} GPUs x 8, 2 iterations"),
             ("bubbles_e2e", "Atlas + BubbleTea, paper-3dc at 400 requests/s, 4 iterations"))
    reference = report.get("reference")
    lines = []
    for key, title in cases:
        for planning in ("searched", "kept"):
            def rounds_of(code: str, planning: str = planning, key: str = key
                          ) -> list[dict[str, Any]]:
                return [r for r in report.get(key, [])
                        if r.get("planning") == planning and r.get("code", "this") == code]
            for code in ("this", reference) if reference else ("this",):
                rounds = rounds_of(code)
                if not rounds:
                    continue
                best = min(rounds, key=lambda r: r["e2e_s"])
                walls = ", ".join(_seconds(r["e2e_s"]) for r in rounds)
                loads = sorted(r["load"][0] for r in rounds)
                speed = ", ".join(f"{r['faster_than_real_time']:.1f}x" for r in rounds) \
                    if "faster_than_real_time" in best else "-"
                ratios = ", ".join(f"{mine['e2e_s'] / theirs['e2e_s']:.2f}" for mine, theirs
                                   in zip(rounds, rounds_of(reference), strict=False)) \
                    if reference and code == "this" else ""
                at = f" at {code[:7]}" if code != "this" else ""
                lines.append(f"| {title.format(**best)}{at} | {planning} | {walls} | "
                             f"{_seconds(best['e2e_cpu_s'])} | {_seconds(best['planning_s'])} | "
                             f"{speed} | {ratios or '-'} | {loads[0]:.1f}-{loads[-1]:.1f} |")
    return _rows("| `testbed simulate` | plan search | wall (rounds) | CPU (best) | planning "
                 "(best) | faster than real time | wall over the reference's (rounds) | load |",
                 lines)


def bubbles_paper_scale(report: dict[str, Any]) -> str:
    """Bubble filling on gpt3-4dc with Atlas: training slowdown, utilization, TTFT."""

    def ttft(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f} s" if value < 0.01 else f"{value:.2f} s"

    return _rows("| requests/s | bubbles | iteration | slowdown | GPU util (total) | served / "
                 "arrived | TTFT p50 | TTFT p99 |", [
        f"| {r['rate']:,.0f} | {r['bubble']} | {r['iteration_s']:.3f} s | "
        + ("-" if r["bubble"] == "none" else f"{r['slowdown']:+.2%}")
        + f" | {r['total_util']:.1%} | {r['served']:,} / {r['requests']:,} | "
        f"{ttft(r['ttft_p50'])} | {ttft(r['ttft_p99'])} |" for r in report["gpt3-4dc"]])


def atlas_transfer(report: dict[str, Any]) -> str:
    """One microbatch's activations over one link: one connection against Atlas's,
    simulated and emulated, from fresh windows and from open ones."""
    parts = (("cold", "sim", "simulated cold"), ("first", "emu", "emulated first"),
             ("warm", "sim", "simulated warm"), ("later", "emu", "emulated later"))
    header = "| one-way latency | Atlas's connections | " + " | ".join(
        f"{title}: 1 conn | Atlas | speed-up" for _, _, title in parts) + " |"
    lines = []
    for r in report["transfer"]:
        cells = []
        for when, backend, _ in parts:
            one, many = r[f"{backend}_1_{when}_s"], r[f"{backend}_n_{when}_s"]
            cells.append(f"{one:.2f} s | {many:.2f} s | {one / many:.2f}x")
        lines.append(f"| {r['one_way_ms']} ms | {r['atlas_connections']} | "
                     + " | ".join(cells) + " |")
    return _rows(header, lines)


def _emulated(row: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    """An emulated row's iteration (machine-bound said) and speed-up over `base`'s."""
    if row is None:
        return "not run | "
    bound = " (machine-bound)" if row["machine_bound"] else ""
    speedup = "" if base is None else f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x"
    return f"{row['iteration_s']:.2f} s{bound} | {speedup}"


def atlas_compare(report: dict[str, Any]) -> str:
    """Every policy on paper-3dc, simulated and emulated at K=1: iteration, speed-up over
    GPipe (ratios of tokens/s), the GPUs' and the WAN's utilization."""
    emulated = {r["combo"]: r for r in report.get("compare_emulate", [])}
    lines = [f"| {r['combo']} | {r['iteration_s']:.2f} s | {r['speedup']:.2f}x "
             f"| {r['util_training']:.1%} | {r['wan_util']:.1%} "
             f"| {_emulated(emulated.get(r['combo']), emulated.get('gpipe'))} |"
             for r in report["compare_simulate"]]
    return _rows("| policy | simulated iteration | speed-up | GPU util | WAN util "
                 "| emulated, K=1 | speed-up |", lines)


def atlas_temporal(report: dict[str, Any]) -> str:
    """Temporal sharing alone at the baselines' placement: Atlas with and without it,
    windows kept warm between turns and not, simulated and emulated."""
    lines = []
    for warm, title in (("on", "warm (slow start after idle off, Atlas's default)"),
                        ("off", "cold (`-o warm=off`: the topology's setting)")):
        cells = []
        for backend in ("simulate", "emulate"):
            rows = {r["combo"]: r for r in report.get(f"temporal_{backend}_warm_{warm}", [])}
            fair, atlas = rows.get("atlas-no-temporal"), rows.get("atlas")
            if fair is None or atlas is None:
                cells.append("not run | | ")
                continue
            bound = " (machine-bound)" if fair["machine_bound"] or atlas["machine_bound"] \
                else ""
            cells.append(f"{fair['iteration_s']:.2f} s | {atlas['iteration_s']:.2f} s | "
                         f"{atlas['tokens_per_s'] / fair['tokens_per_s']:.2f}x{bound}")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return _rows("| windows between turns | atlas-no-temporal | atlas | temporal sharing alone "
                 "| emulated: atlas-no-temporal | atlas | speed-up |", lines)


def atlas_scaling(report: dict[str, Any]) -> str:
    """Tokens/s as DCs join, the batch fixed: GPipe over every DC against Atlas."""
    return _rows("| DCs | GPUs | gpipe tokens/s | atlas tokens/s | Atlas's plan |", [
        f"| {r['dcs']} | {r['gpus']} | "
        + ("does not fit" if r["gpipe_tokens_per_s"] is None else
           f"{r['gpipe_tokens_per_s']:,.0f}")
        + f" | {r['atlas_tokens_per_s']:,.0f} | {r['atlas_plan']} |" for r in report["scaling"]])


def _warm_up(schedule: str) -> str:
    """A per-stage warm-up list with its runs counted: `1f1b+6 (x4)/4 (x4)/0 (x8)`."""
    match = re.fullmatch(r"(?P<head>.*\+)(?P<list>\d+(?:/\d+)+)(?P<tail>.*)", schedule)
    if not match:
        return schedule
    runs: list[list[Any]] = []
    for value in match.group("list").split("/"):
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    listed = "/".join(f"{value} (x{count})" if count > 2 else "/".join([value] * count)
                      for value, count in runs)
    return f"{match.group('head')}{listed}{match.group('tail')}"


def _atlas_plan(plan: dict[str, Any]) -> str:
    """A chosen plan of the search in words, from its notes' fields only."""
    dcs = plan["dcs"]
    where = f"{dcs[0]} alone" if len(dcs) == 1 else \
        f"{'+'.join(dcs)} ({'/'.join(map(str, plan['stages']))} stages)"
    words = [where, f"dp {plan['dp']} x pp {plan['pp']}", _warm_up(plan["schedule"])]
    if plan["temporal"]:
        cell = plan["dp_cell"]
        words.append("temporal" if plan["dp"] == 1 else "temporal, one DP-cell"
                     if cell == plan["dp"] else f"temporal, DP-cells of {cell}")
    if not plan["multi_connection"]:
        words.append("one connection")
    return ", ".join(words)


def _planning(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else \
        f"{seconds:.2f} s" if seconds < 1 else f"{seconds:.1f} s"


def _iteration(seconds: float) -> str:
    """Four significant digits; a job that fits one GPU's microseconds in µs."""
    return f"{seconds * 1e6:#.4g} µs" if seconds < 1e-3 else f"{seconds:#.4g} s"



def atlas_search(report: dict[str, Any]) -> str:
    """Atlas's staged plan search against the grid that simulates every candidate: each
    chosen plan simulated in full, planning times, the lower bound; a summary line."""
    cases = report["cases"]
    table = _rows("| case | Atlas | grid | Atlas / grid | Atlas / lower bound | planning | "
                  "grid planning | Atlas's plan |", [
        f"| {c['case']} | {_iteration(c['staged']['iteration_s'])} | "
        f"{_iteration(c['grid']['iteration_s'])} | {c['ratio_to_grid']:.3f} | "
        f"{c['ratio_to_bound']:.2f} | "
        f"{_planning(c['staged']['planning_s'])} | {_planning(c['grid']['planning_s'])} | "
        f"{_atlas_plan(c['staged']['plan'])} |" for c in cases])
    to_grid = max(cases, key=lambda c: c["ratio_to_grid"])
    bound = sorted(cases, key=lambda c: c["ratio_to_bound"])
    beaten = [c["case"] for c in cases if c["ratio_to_bound"] < 1]
    below = f"; it is below 1, Atlas's plan faster than the bound allows, on " \
        f"{', '.join(beaten)}" if beaten else ""
    faster = [f"{c['case']}, {_atlas_plan(c['grid']['plan'])}" for c in cases
              if c["ratio_to_grid"] > 1]
    grid = f" The grid's plan where it was faster: {'; '.join(faster)}." if faster else ""
    return (f"{table}\n\nAtlas / grid is at most {to_grid['ratio_to_grid']:.3f} "
            f"({to_grid['case']}); Atlas / lower bound runs from "
            f"{bound[0]['ratio_to_bound']:.2f} ({bound[0]['case']}) to "
            f"{bound[-1]['ratio_to_bound']:.2f} ({bound[-1]['case']}){below}.{grid}")


def _peer(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def peers_shares(report: dict[str, Any]) -> str:
    """Each flow's share of a 200 Mbit/s bottleneck: the emulator's median (and range over
    its runs, each measured over the window shown), the simulator's, ns-3's and
    SimGrid's, in Mbit/s; a summary of the agreement, and the RTT bias's exponents as used
    and as fitted."""
    return (f"{_share_rows(report['shares'])}\n\n{_share_agreement(report)}\n\n"
            f"{_rtt_bias(report)}")


TWO_FLOWS_BOUND = 0.10
"""Two flows' agreement the summary under the shares table counts."""


def _control(case: dict[str, Any]) -> str:
    """A share case's congestion control and pacing, as the summaries name them."""
    return f"{case['congestion']} {'paced' if case['paced'] else 'unpaced'}"


def _flow_name(case: dict[str, Any], flow: dict[str, Any]) -> str:
    return f"{_control(case)} {flow['rtt_ms']:g} ms"


def _share_agreement(report: dict[str, Any]) -> str:
    """Two flows' shares within TWO_FLOWS_BOUND of the emulator's median, more flows'
    inside its range over its runs: how many, which are not, and whether the exponents were
    fitted on these runs (in sample) or not."""
    two = [(c, f) for c in report["shares"] if len(c["flows"]) == 2 for f in c["flows"]]
    more = [(c, f) for c in report["shares"] if len(c["flows"]) > 2 for f in c["flows"]]
    apart = [f"{_flow_name(c, f)} ({f['error']:+.0%})" for c, f in two
             if abs(f["error"]) > TWO_FLOWS_BOUND]
    outside = [f"{_flow_name(c, f)} ({f['sim_mbps']:.1f} Mbit/s against "
               f"{f['emulator_mbps']['min']:.1f}-{f['emulator_mbps']['max']:.1f})"
               for c, f in more if not f["inside_spread"]]
    counts = {len(c["flows"]) for c, _ in more}
    more_name = f"{counts.pop()} flows" if len(counts) == 1 else "more flows"
    fits = report["rtt_bias"]
    in_sample = all(r["used"] is not None and abs(r["used"] - r["fitted"]) < 1e-9
                    for r in fits)
    sample = ("In sample: the exponents were fitted on these very runs "
              "(`scripts/rtt_bias_fit.py`), two and more flows together, so these counts "
              "measure how well one power law in RTT can follow them, not how well it "
              "predicts runs it has not seen." if in_sample else
              "Out of sample: the exponents used are not the fit of these runs (below).")
    return (f"Two flows: {len(two) - len(apart)} of {len(two)} within "
            f"{TWO_FLOWS_BOUND:.0%} of the emulator's median"
            f"{' (not: ' + ', '.join(apart) + ')' if apart else ''}; {more_name}: "
            f"{len(more) - len(outside)} of {len(more)} inside the emulator's range over its "
            f"runs{' (not: ' + '; '.join(outside) + ')' if outside else ''}. {sample}"
            f"{_machine_bound_shares(report['shares'])}")


def _machine_bound_shares(cases: list[dict[str, Any]]) -> str:
    """The cases with runs the machine's signals marked machine-bound, how many of how
    many; nothing where none was."""
    bound = [f"{_control(c)} {len(c['flows'])} flows{_where(c)}, "
             f"{c['machine_bound_runs']} of {c['runs']}"
             for c in cases if c.get("machine_bound_runs")]
    return (" Runs the machine's signals marked machine-bound (cores busy, delay lines "
            f"late): {'; '.join(bound)}." if bound else "")


def _rtt_bias(report: dict[str, Any]) -> str:
    """The exponent a of each congestion control and pacing: used, fitted on all share
    runs, and on the two-flow and the eight-flow cases alone."""
    def shown(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    return _rows("| congestion | pacing | a used | fitted on all runs | on two flows alone | "
                 "on eight flows alone |", [
                     f"| {r['congestion']} | {'paced' if r['paced'] else 'unpaced'} | "
                     f"{shown(r['used'])} | {r['fitted']:.2f} | "
                     f"{shown(r['fitted_two_flows'])} | {shown(r['fitted_eight_flows'])} |"
                     for r in report["rtt_bias"]])


def peers_held_out(report: dict[str, Any]) -> str:
    """Two flows' shares at bottleneck rates and behind a queue the RTT bias was not fitted
    at: the table, how many are within TWO_FLOWS_BOUND of the emulator's median, and the
    exponent each case's medians imply."""
    cases = report.get("held_out_shares", [])
    if not cases:
        return "Not recorded (`scripts/bench_peers.py --emulator held-out`)."
    flows = [(c, f) for c in cases for f in c["flows"]]
    apart = [f"{_flow_name(c, f)}{_where(c)} ({f['error']:+.0%})" for c, f in flows
             if abs(f["error"]) > TWO_FLOWS_BOUND]
    two_flow_cases = sorted((c for c in [*report["shares"], *cases] if len(c["flows"]) == 2),
                            key=lambda c: (c.get("queue") is not None, _rate_bps(c)))
    implied = "; ".join(
        f"{control} " + ", ".join(f"{_implied_exponent(c):.2f} "
                                  f"{_where(c).strip() or 'at ' + human_rate(_rate_bps(c))}"
                                  for c in two_flow_cases if _control(c) == control)
        for control in dict.fromkeys(_control(c) for c in cases))
    return (f"{_share_rows(cases)}\n\nOut of sample: {len(flows) - len(apart)} of "
            f"{len(flows)} flows within {TWO_FLOWS_BOUND:.0%} of the emulator's median"
            f"{' (not: ' + '; '.join(apart) + ')' if apart else ''}."
            f"{_machine_bound_shares(cases)} The exponent the emulator's two medians imply "
            f"(ln(short's / long's) / ln(long RTT / short RTT)), by bottleneck: "
            f"{implied}.")


def _implied_exponent(case: dict[str, Any]) -> float:
    """The a for which two flows' shares go as RTT^-a, from the emulator's medians."""
    short, long = case["flows"]
    return math.log(short["emulator_mbps"]["median"] / long["emulator_mbps"]["median"]) / \
        math.log(long["rtt_ms"] / short["rtt_ms"])


def _rate_bps(case: dict[str, Any]) -> float:
    return parse_rate(case.get("rate", FITTED_RATE))


def _where(case: dict[str, Any]) -> str:
    """A share case's bottleneck rate and queue, where they are not the fitted cases'
    (200 Mbit/s, the queue the shaper sizes)."""
    rate, queue = case.get("rate", FITTED_RATE), case.get("queue")
    return ("" if rate == FITTED_RATE else f" at {human_rate(parse_rate(rate))}") + \
        ("" if queue is None else f" behind a {human_bytes(parse_size(queue))} queue")


FITTED_RATE = "200Mbit"
"""The bottleneck rate of the share cases the RTT bias is fitted on."""


def _share_rows(cases: list[dict[str, Any]]) -> str:
    """The table: a row for each flow of each case; a peer's column where it has figures."""
    peers = [(key, name) for key, name in (("ns3_mbps", "ns-3"), ("simgrid_mbps", "SimGrid"))
             if any(f.get(key) is not None for c in cases for f in c["flows"])]
    rows = []
    for case in cases:
        for flow in case["flows"]:
            emu = flow["emulator_mbps"]
            inside = "yes" if flow["inside_spread"] else "no"
            rows.append(
                f"| {case['congestion']}, {'paced' if case['paced'] else 'unpaced'}, "
                f"{len(case['flows'])} flows{_where(case)} | {case['seconds']:g} s after "
                f"{case['omit_s']:g} | {flow['rtt_ms']:g} ms | {emu['median']:.1f} "
                f"({emu['min']:.1f}-{emu['max']:.1f}) | {flow['sim_mbps']:.1f} | "
                f"{flow['error']:+.0%} | {inside} |"
                + "".join(f" {_peer(flow.get(key), '.1f')} |" for key, _ in peers))
    return _rows("| case | emulator's window | RTT | emulator (range) | simulator | error | "
                 "inside range |" + "".join(f" {name} |" for _, name in peers), rows)


def _shows_ceiling(row: dict[str, Any]) -> bool:
    """A case with machine-bound runs that was also simulated at the emulator's forwarding
    ceiling: its table cell and summary show that time."""
    return bool(row["machine_bound_runs"]) and "sim_at_ceiling_s" in row


def _at_ceiling(row: dict[str, Any]) -> str:
    if not _shows_ceiling(row):
        return "-"
    return f"{row['sim_at_ceiling_s']:.3f} s ({row['error_at_ceiling']:+.0%})"


def _transfer_rows(rows: list[dict[str, Any]], at_ceiling: bool) -> list[str]:
    out = []
    for r in rows:
        emu = r["emulator_s"]
        bound = f"{r['machine_bound_runs']} of {r['runs']}"
        ceiling = f" | {_at_ceiling(r)}" if at_ceiling else ""
        out.append(
            f"| {r['congestion']} | {r['loss']:.2%} | {r['connections']} | {r['megabytes']:g} MB "
            f"| {r['rtt_ms']:g} ms | {emu['median']:.3f} s ({emu['min']:.2f}-{emu['max']:.2f}) "
            f"| {r['megabytes'] * 8 / emu['median']:.0f} Mbit/s "
            f"| {r['sim_s']:.3f} s | {r['error']:+.0%}{ceiling} | {_peer(r.get('ns3_s'), '.3f')} "
            f"| {_peer(r.get('simgrid_s'), '.3f')} | {bound} | "
            f"{r['delay_line_late_mean_ms']:.2f} ms |")
    return out


def _transfer_head(at_ceiling: bool) -> str:
    ceiling = " simulator at this machine's ceiling (error) |" if at_ceiling else ""
    return ("| congestion | loss | connections | bytes | RTT | emulator (range) | emulator's "
            f"mean rate | simulator | error |{ceiling} ns-3 | SimGrid | machine-bound runs | "
            "delay lines late (worst mean) |")


def _agreement(rows: list[dict[str, Any]], bound: float) -> str:
    """How many cases the simulator's time is within `bound` of the emulator's median and
    inside the emulator's range of runs."""
    errors = [r["error"] for r in rows]
    if not errors:
        return ""
    within = sum(abs(e) <= bound for e in errors)
    inside = sum(r["inside_spread"] for r in rows)
    return (f"Within {bound:.0%} of the emulator's median: {within} of {len(rows)} cases "
            f"(errors from {min(errors):+.1%} to {max(errors):+.1%}); inside the emulator's "
            f"own range (its fastest to its slowest run): {inside} of {len(rows)}.")


def _ceiling_summary(report: dict[str, Any], part: str, bound: float) -> str:
    """The cases of `part` with machine-bound runs against the simulator at the
    forwarding ceiling, and where the cases lie that are outside `bound` even so."""
    bound_rows = [r for r in report[part] if _shows_ceiling(r)]
    if not bound_rows:
        return ""
    goodputs = [g for c in report.get("ceiling", []) for g in c["goodput_mbps"]]
    late = [ms for c in report.get("ceiling", []) for ms in c["delay_line_late_mean_ms"]
            if ms is not None]
    lateness = f", its delay lines {min(late):.1f}-{max(late):.1f} ms late on average" \
        if late else ""
    full = sum(abs(r["error"]) <= bound for r in bound_rows)
    capped = sum(abs(r["error_at_ceiling"]) <= bound for r in bound_rows)
    counted = [(r["loss"], r["error_at_ceiling"] if _shows_ceiling(r) else r["error"])
               for r in report[part]]
    outside = [(loss, error) for loss, error in counted if abs(error) > bound]
    losses = " and ".join(f"{loss:.2%}" for loss in sorted({loss for loss, _ in outside}))
    faster = sum(error < 0 for _, error in outside)
    rest = (f" Counting those against the simulator at the ceiling, the {len(outside)} cases "
            f"still outside {bound:.0%} are at {losses} loss, the simulator faster in "
            f"{faster}.") if outside else ""
    return (f" Of the {len(bound_rows)} cases with machine-bound runs, within {bound:.0%}: "
            f"{full} against the simulator on the full link, {capped} against the simulator "
            f"on the link capped at this machine's forwarding ceiling "
            f"({bound_rows[0]['ceiling_mbps']:.0f} Mbit/s, the median goodput of "
            f"{len(goodputs)} `ceiling` runs{lateness}).{rest}")


LOSS_BOUND, LONG_BOUND = 0.15, 0.05
"""The agreement the summaries under the loss and long-flow tables count."""


def _lossy_transfers(report: dict[str, Any], part: str) -> str:
    """Fresh connections on a lossy 1 Gbit/s link (`part` of the report): seconds until the
    last byte arrived; a summary of the agreement, the cases with machine-bound runs
    against the simulator at the emulator's forwarding ceiling."""
    rows = report[part]
    return (f"{_rows(_transfer_head(True), _transfer_rows(rows, True))}\n\n"
            f"{_agreement(rows, LOSS_BOUND)}{_ceiling_summary(report, part, LOSS_BOUND)}")


def peers_loss(report: dict[str, Any]) -> str:
    return _lossy_transfers(report, "loss")


def peers_between(report: dict[str, Any]) -> str:
    """The loss table for the loss rates between its own (`between`): cases the loss model
    was not built on."""
    if not report.get("between"):
        return "No runs at loss rates between the loss cases' are recorded."
    return _lossy_transfers(report, "between")


def peers_long(report: dict[str, Any]) -> str:
    """200 MB over one connection on Linux's default buffers, and a summary."""
    rows = report["long"]
    return (f"{_rows(_transfer_head(False), _transfer_rows(rows, False))}\n\n"
            f"{_agreement(rows, LONG_BOUND)}")


BURSTS_BOUND = 0.10
"""The bursts' agreement the summary under their table counts."""


def peers_bursts(report: dict[str, Any]) -> str:
    """Rounds of equal messages started together over one link: each round's mean seconds,
    the first round (fresh connections) and the later ones' median (after an idle), the
    emulator's against the simulator's; how far apart a round's messages finished."""
    rows = [f"| {r['congestion']} | {r['flows']} | {r['megabytes']:.0f} MB "
            f"| {'yes' if r['paced'] else 'no'} | {r['emulator_first_s']:.3f} s "
            f"| {r['sim_first_s']:.3f} s | {r['error_first']:+.1%} "
            f"| {r['emulator_later_s']:.3f} s | {r['sim_later_s']:.3f} s "
            f"| {r['error_later']:+.1%} | {r['emulator_apart']:.1%} | {r['rounds']} "
            f"| {'yes' if r['machine_bound'] else 'no'} |" for r in report["bursts"]]
    table = _rows("| congestion | messages | each | paced | emulator, first round | simulator "
                  "| error | emulator, later rounds | simulator | error | emulator's apart "
                  "| rounds | machine-bound |", rows)
    errors = [e for r in report["bursts"] for e in (r["error_first"], r["error_later"])]
    if not errors:
        return table
    within = sum(abs(e) <= BURSTS_BOUND for e in errors)
    apart = [r["emulator_apart"] for r in report["bursts"]]
    return (f"{table}\n\nWithin {BURSTS_BOUND:.0%} of the emulator: {within} of {len(errors)} "
            f"(errors from {min(errors):+.1%} to {max(errors):+.1%}). In the emulator a "
            f"round's first and last message finished {min(apart):.1%} to {max(apart):.1%} "
            "of its mean apart (mean over rounds); in the simulator they finish together.")


def peers_stripes(report: dict[str, Any]) -> str:
    """Lossy transfers over several connections, each connection sampled with `ss -tin`:
    what share of the message it carried and where its first loss ended its slow start,
    beside the simulator's own run of the case, connection by connection."""
    def threshold(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    stripes = report.get("stripes", [])
    rows = [f"| {r['congestion']} | {r['loss']:.2%} | {r['connections']} "
            f"| {r['megabytes']:.0f} MB | {r['emulator_s']:.3f} s | {r['sim_s']:.3f} s "
            f"| {r['least_share']:.2f}-{r['most_share']:.2f} "
            f"| {r['model_least_share']:.2f}-{r['model_most_share']:.2f} "
            f"| {r['left_slow_start']} of {r['sampled']} "
            f"| {threshold(r['earliest_threshold'])} | {threshold(r['model_first_threshold'])} "
            f"| {share(r['earliest_share'])} | {share(r['model_earliest_share'])} "
            f"| {'yes' if r['machine_bound'] else 'no'} |" for r in stripes]
    table = _rows("| congestion | loss | connections | bytes | emulator | simulator "
                  "| a connection's bytes, of an even share | simulator's "
                  "| left slow start | earliest loss's threshold (segments) | simulator's "
                  "| its connection's bytes, of an even share | simulator's "
                  "| machine-bound |", rows)
    earliest = [r for r in stripes if r["earliest_threshold"] is not None]
    if not earliest:
        return table
    modelled = [r for r in earliest if r["model_first_threshold"] is not None]
    within = sum(0.5 <= r["earliest_threshold"] / r["model_first_threshold"] <= 2.0
                 for r in modelled)
    least = sum(r["earliest_share"] <= r["least_share"] for r in earliest)
    cases = {r["case"]: r for r in stripes}  # the simulator's figures are one per case
    model_least = sum(r["model_earliest_share"] is not None
                      and r["model_earliest_share"] <= r["model_least_share"]
                      for r in cases.values())
    return (f"{table}\n\nIn {len(earliest)} of {len(stripes)} runs a connection left slow "
            f"start. The earliest first loss of a run set a threshold of "
            f"{min(r['earliest_threshold'] for r in earliest):,.0f} to "
            f"{max(r['earliest_threshold'] for r in earliest):,.0f} segments, within a "
            f"factor of two of the simulator's earliest in {within} of {len(modelled)}. A "
            f"connection carried from {min(r['least_share'] for r in stripes):.2f} to "
            f"{max(r['most_share'] for r in stripes):.2f} of an even share of its message "
            f"(the simulator: {min(r['model_least_share'] for r in stripes):.2f} to "
            f"{max(r['model_most_share'] for r in stripes):.2f}); the connection whose "
            f"first loss came earliest carried the least in {least} of {len(earliest)} runs, "
            f"and in the simulator in {model_least} of {len(cases)} cases."
            + _without_loss(stripes))


def _without_loss(stripes: list[dict[str, Any]]) -> str:
    """Per case, the connections whose slow start ended without a retransmission."""
    parts = []
    for case in dict.fromkeys(r["case"] for r in stripes):
        runs = [r for r in stripes if r["case"] == case]
        ranges = [r["thresholds_without_loss"] for r in runs if r["thresholds_without_loss"]]
        if ranges:
            first = runs[0]
            parts.append(f"{sum(r['left_without_loss'] for r in runs)} of "
                         f"{sum(r['sampled'] for r in runs)} at {first['loss']:.2%} over "
                         f"{first['connections']} connections, at "
                         f"{min(low for low, _ in ranges):,.0f}-"
                         f"{max(high for _, high in ranges):,.0f} segments")
    return (" Connections that left slow start without a single retransmission (not a loss "
            f"ended it): {'; '.join(parts)}.") if parts else ""


def peers_scale(report: dict[str, Any]) -> str:
    """CPU seconds to move N concurrent flows: the simulator's flow model and SimGrid's."""
    rows = []
    for r in report["scale"]:
        sim = r.get("sim_cpu_s")
        ratio = r.get("ratio")
        simgrid = "not run" if r.get("simgrid_not_run") else _peer(r.get("simgrid_cpu_s"), ".2f")
        shown = "-" if ratio is None else f"{ratio:.1f}x" if ratio >= 1 else f"{ratio:.3f}x"
        rows.append(f"| {r['flows']:,} | {_peer(sim, '.2f') if sim is not None else 'not run'} "
                    f"| {simgrid} | {shown} |")
    return _rows("| concurrent flows | simulator, CPU s | SimGrid, CPU s | simulator / SimGrid |",
                 rows)


def peers_windows(report: dict[str, Any]) -> str:
    """One connection's window by the bottleneck's rate: what it delivered per round trip
    of its send buffer, and the model's figure (scripts/window_fit.py)."""
    rows = [f"| {r['rate_bps'] / 1e9:g} Gbit/s | {r['rtt_ms']:g} ms | "
            f"{r['median']:.2f} ({min(r['shares']):.2f}-{max(r['shares']):.2f}) | "
            f"{r['fitted']:.2f} | {r['model']:.2f} | {r['machine_bound_runs']} of "
            f"{len(r['shares'])} |" for r in report.get("windows", [])]
    return _rows("| bottleneck | RTT | delivered per round trip, of 4 MiB (range) | "
                 "scaled to 0.71 at 1 Gbit/s | model | machine-bound runs |", rows)


def peers_inflight(report: dict[str, Any]) -> str:
    """What one connection of the transport keeps in flight on Linux's default buffers,
    sampled with `ss -tin` on the sender once its window stopped growing."""
    import statistics

    rows = []
    for r in report.get("inflight", []):
        unacked = statistics.median(r["unacked_segments"])
        rows.append(
            f"| {r['case'].split('-')[-1]} ms | {r['seconds']:.2f} s | "
            f"{r['steady_goodput_mbps']:.0f} Mbit/s | {unacked:,.0f} "
            f"({min(r['unacked_segments']):,.0f}-{max(r['unacked_segments']):,.0f}) | "
            f"{unacked * 1448 / 4 / 2**20:.2f} | "
            f"{statistics.median(r['notsent_bytes']) / 1e6:.2f} MB | "
            f"{statistics.median(r['snd_wnd_bytes']) / 1e6:.2f} MB | {r['cwnd_segments']:,.0f} | "
            f"{r['rwnd_limited_ms']:.0f} ms | {r['sndbuf_limited_ms']:.0f} of "
            f"{r['busy_ms']:.0f} ms |")
    return _rows("| RTT | transfer | steady goodput | segments in flight (range) | of 4 MiB | "
                 "queued, not sent | receiver's window | cwnd (segments) | limited by the "
                 "receiver's window | limited by the send buffer |", rows)


NOISE_VARIANTS = (
    ("bubbletea", "bubbletea (the defaults: guard 0.1, chunks, one prompt per pass; bubbles "
                  "predicted as the median of three waits)"),
    ("bubbletea chunk=off", "bubbletea, `chunk=off` (whole prompts only)"),
    ("bubbletea learn=on", "bubbletea, `learn=on` (learned guard)"),
    ("bubbletea batch=4", "bubbletea, `batch=4`"),
    ("greedy", "greedy"),
)
"""scripts/bench_bubbles_noise.py's variants under noise, in the table's order."""


def bubbles_noise(report: dict[str, Any]) -> str:
    """Each bubble policy under noise over its seeds: mean total utilization, the
    slowdown `testbed compare` gives (mean and 95% interval), the range of the seeds'
    overrun fractions and the mean of all their overruns."""
    none = report["bubbletea"]["runs"]["none"]
    rows = [f"| none | {statistics.mean(r['util_total'] for r in none):.1%} | - | - | - |"]
    for key, label in NOISE_VARIANTS:
        entry = report[key]
        filled = next(runs for name, runs in entry["runs"].items() if name != "none")
        slowdown = Interval(**entry["slowdown"]).percent()
        overruns = [r["overruns"] for r in filled]
        fractions = [o["fraction"] for o in overruns]
        late = sum(o["overran"] * o["mean_s"] for o in overruns if o["overran"])
        count = sum(o["overran"] for o in overruns)
        rows.append(f"| {label} | {statistics.mean(r['util_total'] for r in filled):.1%} | "
                    f"{slowdown} | {min(fractions):.1%}-{max(fractions):.1%} | "
                    f"{late / count * 1e3:.1f} ms |")
    return _rows("| bubbles | GPU util (total) | training slowdown, mean [95% interval] "
                 "| prefills that overran | mean overrun |", rows)
