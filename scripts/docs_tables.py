#!/usr/bin/env python3
"""The measured tables of the documentation, rendered from benchmarks/*.json, never copied
by hand.

A table sits in a page of docs/ between `<!-- NAME:begin (scripts/docs_tables.py) -->` and
`<!-- NAME:end -->`; NAME says which JSON files it is drawn from and how (TABLES below).
Under each table a line names the commit that measured it: the JSON's own `commit` when
it records one, else the last commit that changed the file (`git log -1 -- FILE`), or says
that the file has changes not committed yet, or that there is no git to ask.

`.venv/bin/python scripts/docs_tables.py` rewrites every marked table in docs/;
`--check` rewrites nothing and exits 1 naming each table whose page differs from what its
JSON renders (the test suite runs it). After measuring again: commit the JSON, then run
this and commit the pages, so that the line under each table can name that commit.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
COMMAND = "scripts/docs_tables.py"
STAMP = "*Measured at "
"""How the line under every table starts (the rest names commits and files)."""

BLOCK = re.compile(r"(?P<begin><!-- (?P<name>[a-z0-9-]+):begin(?: \([^)\n]*\))? -->)\n"
                   r"(?P<body>.*?)(?P<end><!-- (?P=name):end -->)", re.S)


@dataclass(frozen=True)
class Table:
    """A measured table: the JSON files it is drawn from (relative to the repository), how
    it is drawn from them (the loaded files, in that order), and what measures them."""

    sources: tuple[str, ...]
    render: Callable[..., str]
    measured_by: str


def _script(name: str) -> Any:
    """A benchmark script as a module, for its table renderer (scripts/ is no package)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    return __import__(name)


def _scenarios(report: dict[str, Any]) -> str:
    return str(_script("bench_scenarios").table(report.get("runs", {})))


def _sweep(report: dict[str, Any]) -> str:
    return str(_script("bench_sweep").table(report))


def _diloco(report: dict[str, Any]) -> str:
    return str(_script("bench_diloco").tables(report))


def _schedules(report: dict[str, Any]) -> str:
    return str(_script("bench_schedules").tables(report))


def _fidelity(report: dict[str, Any]) -> str:
    script = _script("bench_fidelity")
    return f"{script.table(report['rows'])}\n\n{script.summary(report['rows'])}"


def _fidelity_share_noise(report: dict[str, Any]) -> str:
    script = _script("bench_fidelity")
    return (f"{script.share_noise_table(report)}\n\n{script.share_noise_summary(report)}\n\n"
            f"{script.share_noise_cost_table(report['cost'])}")


def _fidelity_trace(report: dict[str, Any]) -> str:
    return str(_script("bench_fidelity").trace_table(report))


def _emulator_scale(report: dict[str, Any]) -> str:
    return str(_script("bench_emulator_scale").readme(report))


def _bubbles(report: dict[str, Any]) -> str:
    return str(_script("bench_bubbles").table(report["paper-3dc"]))


def _measured(name: str) -> Callable[..., str]:
    """A renderer of scripts/measured_tables.py (tables no benchmark script prints)."""
    return getattr(_script("measured_tables"), name)  # type: ignore[no-any-return]


def _api_example(report: dict[str, Any]) -> str:
    return str(_script("bench_api_example").table(report))


def _soak_state(report: dict[str, Any]) -> str:
    return str(_script("soak_faults_state").table(report))


def _time_to_loss(report: dict[str, Any]) -> str:
    return str(_script("bench_diloco").ranking(report))


def _loss_model(report: dict[str, Any]) -> str:
    return str(_script("bench_loss_model").table(report))


def _loss_real(report: dict[str, Any]) -> str:
    return str(_script("bench_loss_real").tables(report))


def _launch(report: dict[str, Any]) -> str:
    return str(_script("bench_launch").table(report))


def _streaming_table(report: dict[str, Any]) -> str:
    return str(_script("bench_streaming_table").table(report))


def _bucket_overlap(report: dict[str, Any]) -> str:
    return str(_script("bench_streaming_table").overlap_table(report))


def _wan_tcp(report: dict[str, Any]) -> str:
    script = _script("bench_wan_tcp")
    return f"{script.table(report)}\n\n{script.summary(report)}"


def _claims(records: list[Any]) -> str:
    from testbed.figures.render import claims_block

    return claims_block(records)


INDEX = "measurements"
"""The measurements page's list of every other table (drawn from TABLES, not from JSON)."""

TABLES: dict[str, Table] = {
    INDEX: Table((), str, "scripts/docs_tables.py"),
    "fidelity": Table(("benchmarks/fidelity.json",), _fidelity,
                      "scripts/bench_fidelity.py --topologies two-dc,paper-3dc; "
                      "--topologies high-bdp-2dc,asymmetric-4dc --policies atlas,gpipe --keep; "
                      "--topologies wan-3dc --policies gpipe,1f1b --max-wall 400 --keep; "
                      "--topologies paper-3dc --policies gpipe,1f1b --repeat 3 --max-wall 400 "
                      "--keep; --topologies mid-rate-3dc --policies gpipe,1f1b,atlas "
                      "--max-wall 400 --keep; --topologies detour-3dc --policies "
                      "gpipe,1f1b,atlas --repeat 3 --max-wall 400 --keep; --topologies "
                      "detour-3dc-direct,detour-3dc-deep --policies gpipe,1f1b --repeat 3 "
                      "--max-wall 400 --keep; --parts resimulate"),
    "fidelity-share-noise": Table(("benchmarks/fidelity-share-noise.json",),
                                  _fidelity_share_noise,
                                  "scripts/bench_fidelity.py --parts share-noise"),
    "fidelity-trace": Table(("benchmarks/fidelity-trace.json",), _fidelity_trace,
                            "scripts/bench_fidelity.py --parts trace"),
    "wan-tcp": Table(("benchmarks/wan-tcp.json",), _wan_tcp, "scripts/bench_wan_tcp.py"),
    "scenarios": Table(("benchmarks/scenarios.json",), _scenarios,
                       "scripts/bench_scenarios.py"),
    "sweep-speed": Table(("benchmarks/sweep.json",), _sweep, "scripts/bench_sweep.py"),
    "paper-claims": Table(("benchmarks/claims/claims.json",), _claims,
                          "scripts/bench_claims.py"),
    "diloco": Table(("benchmarks/diloco.json",), _diloco, "scripts/bench_diloco.py"),
    "time-to-loss": Table(("benchmarks/diloco.json",), _time_to_loss,
                          "scripts/bench_diloco.py --parts simulate"),
    "loss-model": Table(("benchmarks/loss-model.json",), _loss_model,
                        "scripts/bench_loss_model.py"),
    "loss-real": Table(("benchmarks/loss-real.json",), _loss_real,
                       "scripts/bench_loss_real.py"),
    "net-rtt": Table(("benchmarks/net.json",), _measured("net_rtt"), "scripts/bench_net.py"),
    "net-throughput": Table(("benchmarks/net.json",), _measured("net_throughput"),
                            "scripts/bench_net.py"),
    "cluster-net": Table(("benchmarks/cluster-net.json",), _measured("cluster_net"),
                         "scripts/bench_cluster.py"),
    "cluster-run": Table(("benchmarks/cluster-run.json", "benchmarks/cluster-run-2.json"),
                         _measured("cluster_run"), "scripts/bench_cluster_run.py"),
    "transport": Table(("benchmarks/transport.json",), _measured("transport"),
                       "scripts/bench_transport.py"),
    "transport-pacing": Table(("benchmarks/transport-pacing.json",),
                              _measured("transport_pacing"),
                              "scripts/bench_transport.py --pacing"),
    "emulator-scale": Table(("benchmarks/emulator-scale.json",), _emulator_scale,
                            "scripts/bench_emulator_scale.py"),
    "sim-speed": Table(("benchmarks/sim-speed.json",), _measured("sim_speed"),
                       "scripts/bench_sim.py --skip-emulator"),
    "sim-e2e": Table(("benchmarks/sim-e2e.json",), _measured("sim_e2e"),
                     "scripts/bench_sim.py --skip-scale --e2e SIZES"),
    "sim-e2e-searched": Table(("benchmarks/sim-e2e.json",), _measured("sim_e2e_searched"),
                              "scripts/bench_sim.py --skip-scale --e2e SIZES --atlas GPUS "
                              "--bubbles"),
    "atlas-transfer": Table(("benchmarks/atlas-transfer.json",), _measured("atlas_transfer"),
                            "scripts/bench_atlas.py --parts transfer --emulate"),
    "atlas-compare": Table(("benchmarks/atlas-compare.json",), _measured("atlas_compare"),
                           "scripts/bench_atlas.py --parts compare --emulate"),
    "atlas-temporal": Table(("benchmarks/atlas-compare.json",), _measured("atlas_temporal"),
                            "scripts/bench_atlas.py --parts compare --emulate"),
    "atlas-scaling": Table(("benchmarks/atlas-scaling.json",), _measured("atlas_scaling"),
                           "scripts/bench_atlas.py --parts scaling"),
    "atlas-search": Table(("benchmarks/atlas-search.json",), _measured("atlas_search"),
                          "scripts/bench_atlas_search.py"),
    "bubbles": Table(("benchmarks/bubbles.json",), _bubbles, "scripts/bench_bubbles.py"),
    "bubbles-noise": Table(("benchmarks/bubbles-noise.json",), _measured("bubbles_noise"),
                           "scripts/bench_bubbles_noise.py"),
    "bubbles-paper-scale": Table(("benchmarks/bubbles-paper-scale.json",),
                                 _measured("bubbles_paper_scale"),
                                 "scripts/bench_bubbles.py --paper-scale"),
    "schedules": Table(("benchmarks/schedules.json",), _schedules,
                       "scripts/bench_schedules.py"),
    "api-example": Table(("benchmarks/api-example.json",), _api_example,
                         "scripts/bench_api_example.py"),
    "soak-faults-state": Table(("benchmarks/soak-faults-state.json",), _soak_state,
                               "scripts/soak_faults_state.py"),
    "launch": Table(("benchmarks/launch.json",), _launch, "scripts/bench_launch.py"),
    "peers-shares": Table(("benchmarks/peers.json",), _measured("peers_shares"),
                          "scripts/bench_peers.py"),
    "peers-held-out": Table(("benchmarks/peers.json",), _measured("peers_held_out"),
                            "scripts/bench_peers.py"),
    "peers-loss": Table(("benchmarks/peers.json",), _measured("peers_loss"),
                        "scripts/bench_peers.py"),
    "peers-between": Table(("benchmarks/peers.json",), _measured("peers_between"),
                           "scripts/bench_peers.py"),
    "peers-bursts": Table(("benchmarks/peers.json",), _measured("peers_bursts"),
                          "scripts/bench_peers.py"),
    "peers-long": Table(("benchmarks/peers.json",), _measured("peers_long"),
                        "scripts/bench_peers.py"),
    "peers-stripes": Table(("benchmarks/peers.json",), _measured("peers_stripes"),
                           "scripts/bench_peers.py"),
    "peers-scale": Table(("benchmarks/peers.json",), _measured("peers_scale"),
                         "scripts/bench_peers.py"),
    "peers-inflight": Table(("benchmarks/peers.json",), _measured("peers_inflight"),
                            "scripts/bench_peers.py"),
    "peers-windows": Table(("benchmarks/peers.json",), _measured("peers_windows"),
                           "scripts/bench_peers.py"),
    "streaming-table": Table(("benchmarks/streaming-table.json",), _streaming_table,
                             "scripts/bench_streaming_table.py --parts table,table1"),
    "bucket-overlap": Table(("benchmarks/streaming-table.json",), _bucket_overlap,
                            "scripts/bench_streaming_table.py --parts "
                            "overlap-simulate,overlap-emulate --dilation 4"),
}


def _git(*args: str) -> str | None:
    """git's answer in the repository, or None where there is no git or no repository."""
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              text=True, check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def measured_at(source: str) -> str:
    """Which commit measured this file (relative to the repository): its own record, else
    git's last change to it."""
    data = json.loads((ROOT / source).read_text(encoding="utf-8"))
    if isinstance(data, dict) and isinstance(data.get("commit"), str):
        return f"commit {data['commit']}"
    if source.startswith("../") or Path(source).is_absolute():
        return "a commit unknown here (the file is outside the repository)"
    if _git("rev-parse", "--is-inside-work-tree") != "true":
        return "a commit unknown here (no git)"
    if _git("status", "--porcelain", "--", source):
        return "a commit not made yet (changes to it are not committed)"
    full = _git("log", "-1", "--format=%H", "--", source)
    return f"commit {full[:10]}" if full else "a commit not made yet (not committed)"


def stamp(sources: Sequence[str]) -> str:
    """The line under a table: `*Measured at commit 1a2b3c4d5e (benchmarks/x.json).*`"""
    if not sources:
        return STAMP + "a commit unknown here (the table was not saved to a JSON file).*"
    return STAMP + " and ".join(f"{measured_at(s)} (`{s}`)" for s in sources) + ".*"


def _source(path: Path) -> str:
    """A JSON file's name as stamps give it: relative to the repository."""
    absolute = path.resolve()
    return str(absolute.relative_to(ROOT)) if absolute.is_relative_to(ROOT) else str(absolute)


def render(name: str, where: dict[str, Path]) -> str:
    """A table's block, between its markers: the table, then its stamp."""
    if name == INDEX:
        return index(where)
    table = TABLES[name]
    loaded = [json.loads((ROOT / s).read_text(encoding="utf-8")) for s in table.sources]
    return table.render(*loaded).strip("\n") + "\n\n" + stamp(table.sources) + "\n"


def replace_block(text: str, name: str, body: str, where: str) -> str:
    """`text` with the block NAME holding `body`; its begin marker kept as written."""
    found = [m for m in BLOCK.finditer(text) if m.group("name") == name]
    if len(found) != 1:
        raise SystemExit(f"{where}: {len(found)} <!-- {name}:begin ... --> ... "
                         f"<!-- {name}:end --> blocks; expected one")
    match = found[0]
    return text[: match.start("body")] + body + text[match.end("body"):]


def write_block(page: Path, name: str, table: str, sources: Sequence[Path]) -> None:
    """For a benchmark's own `--readme PAGE`: its fresh table, stamped with the commit of
    the JSON files it came from, into PAGE."""
    text = page.read_text(encoding="utf-8")
    body = table.strip("\n") + "\n\n" + stamp([_source(p) for p in sources]) + "\n"
    page.write_text(replace_block(text, name, body, str(page)), encoding="utf-8")


def render_into(page: Path, name: str) -> None:
    """One table of `page` rendered again from its JSON files."""
    text = page.read_text(encoding="utf-8")
    body = render(name, {})
    page.write_text(replace_block(text, name, body, str(page)), encoding="utf-8")


def index(where: dict[str, Path]) -> str:
    """The measurements page's list: every marked table, its page, what measures it and
    the files it is drawn from."""
    lines = ["| table | page | measured by | drawn from |", "| --- | --- | --- | --- |"]
    for name, page in where.items():
        if name == INDEX:
            continue
        table = TABLES[name]
        title = page.read_text(encoding="utf-8").partition("\n")[0].lstrip("# ")
        files = ", ".join(f"`{s}`" for s in table.sources)
        lines.append(f"| {name} | [{title}]({page.name}) | `{table.measured_by}` | {files} |")
    return "\n".join(lines) + "\n"


def blocks(pages: Iterable[Path]) -> dict[str, Path]:
    """Each marked table's page, in the order of the pages and of the tables in each; a
    name twice or unknown is refused."""
    where: dict[str, Path] = {}
    for page in pages:
        for match in BLOCK.finditer(page.read_text(encoding="utf-8")):
            name = match.group("name")
            if name not in TABLES:
                raise SystemExit(f"{_rel(page)}: no table is named {name!r} "
                                 f"(known: {', '.join(sorted(TABLES))})")
            if name in where:
                raise SystemExit(f"{_rel(page)}: table {name!r} is also in "
                                 f"{_rel(where[name])}")
            where[name] = page
    missing = sorted(set(TABLES) - set(where))
    if missing:
        raise SystemExit(f"docs: no page holds the table(s) {', '.join(missing)}")
    return where


def history() -> bool:
    """Whether git can say which commit last changed a file: a repository, not shallow."""
    return (_git("rev-parse", "--is-inside-work-tree") == "true"
            and _git("rev-parse", "--is-shallow-repository") == "false")


def _unstamped(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.startswith(STAMP))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a page differs from its JSON")
    args = parser.parse_args(argv)
    where = blocks(sorted(DOCS.glob("*.md")))
    exact = history()
    if args.check and not exact:
        print("docs_tables: no git history here (no repository, or a shallow one): the "
              "tables are checked, the commits under them are not", file=sys.stderr)
    stale: list[str] = []
    for page in dict.fromkeys(where.values()):
        text = new = page.read_text(encoding="utf-8")
        for name in (n for n, p in where.items() if p == page):
            updated = replace_block(new, name, render(name, where), _rel(page))
            if (updated != new) if exact or not args.check else \
                    _unstamped(updated) != _unstamped(new):
                sources = ", ".join(TABLES[name].sources) or "the other tables"
                stale.append(f"{_rel(page)}: {name} (from {sources})")
            new = updated
        if new != text and not args.check:
            page.write_text(new, encoding="utf-8")
    if args.check and stale:
        print("these tables differ from what their JSON renders; run "
              f"`.venv/bin/python {COMMAND}` and commit the pages:", file=sys.stderr)
        for line in stale:
            print(f"  {line}", file=sys.stderr)
        return 1
    for line in stale:
        print(f"rewrote {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
