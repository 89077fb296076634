"""Bounds on what testbed reads and counts: each input that sets how much work or memory a
command takes, or how long a run lasts, has a documented limit and past it one line naming
the file or flag, the key and the limit, before anything runs; a run cannot outgrow its
clock."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.errors import InputError
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.policy import training_policy
from testbed.scenario.scenario import load_scenario
from testbed.sim.agenda import Agenda
from testbed.sim.simulator import Simulator
from testbed.topology import load_topology
from testbed.topology.net_events import parse_event_flag

from .scripts import script
from .test_cli import call

ROOT = Path(__file__).resolve().parent.parent
TWO_DC = ROOT / "topologies" / "two-dc.yaml"
TESTBED = [sys.executable, "-c", "from testbed.cli.main import main; main()"]


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- stacked stragglers, and the simulator's clock ---------------------------------------

def _stragglers(*entries: str) -> str:
    return "stragglers:\n" + "".join(f"  - {{{entry}}}\n" for entry in entries)


@pytest.mark.parametrize(("entries", "key"), [
    (["gpu: east-0, slower: 1000"] * 8, "stragglers[1]"),
    (["gpu: east-0, slower: 100", "dc: east, slower: 20, at: 5s"], "stragglers[1]"),
    (["dc: west, slower: 40, for: 10s", "dc: west, at: 9s, slower: 40"], "stragglers[1]"),
])
def test_stacked_stragglers_are_refused_past_the_combined_limit(
        tmp_path: Path, entries: list[str], key: str) -> None:
    """Eight entries of `slower: 1000` on one GPU multiplied to 1e24 and hung the
    simulator; overlapping windows (a GPU's own and its DC's) multiply to at most 1000."""
    path = _file(tmp_path, "s.yaml", _stragglers(*entries))
    with pytest.raises(InputError) as refused:
        load_scenario(path, load_topology(TWO_DC))
    message = str(refused.value)
    assert message.startswith(f"{path}: {key}: with the stragglers over it then, ")
    assert message.endswith("overlapping stragglers multiply, to at most 1000 together")


def test_stragglers_that_stay_within_the_limit_or_do_not_overlap_are_read(
        tmp_path: Path) -> None:
    path = _file(tmp_path, "s.yaml", _stragglers(
        "gpu: east-0, slower: 10", "gpu: east-0, slower: 10", "dc: east, slower: 10",
        "gpu: west-0, slower: 1000, for: 1s", "gpu: west-0, at: 1s, slower: 1000"))
    scenario, _ = load_scenario(path, load_topology(TWO_DC))
    assert len(scenario.stragglers) == 5


def test_stacked_stragglers_are_one_line_exit_2_from_the_cli(tmp_path: Path) -> None:
    path = _file(tmp_path, "s.yaml", _stragglers(*["gpu: east-0, slower: 1000"] * 8))
    done = subprocess.run([*TESTBED, "simulate", str(TWO_DC), "--scenario", str(path),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "stragglers[1]" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_agenda_refuses_a_run_still_going_past_its_horizon() -> None:
    ran: list[float] = []
    going = Agenda(lambda: True)
    going.at(1.0, ran.append)
    going.at(2e10, ran.append)
    with pytest.raises(RuntimeError, match=r"still going after 1e\+10 s of simulated time"):
        going.run()
    finished = Agenda(lambda: False)  # only late callbacks left: a link back after the run
    finished.at(2e10, ran.append)
    finished.at(3e10, ran.append)
    finished.run()
    assert ran == [1.0, 2e10, 3e10]


@pytest.mark.timeout(60)
def test_a_run_longer_than_the_clock_holds_is_a_one_line_error(tmp_path: Path) -> None:
    """A link down for 1e11 s ran rounds of TCP through the outage, trillions of them."""
    code, _, err = call(["simulate", str(TWO_DC), "-p", "gpipe", "--event",
                         "at=0s,link=east-west,down=1e11s", "--out", str(tmp_path / "a")])
    assert (code, err) == (1, "testbed: error: simulation failed: the run was still going "
                           "after 1e+10 s of simulated time (317 years), the longest a run "
                           "may last\n")
    code, _, err = call(["simulate", str(TWO_DC), "-p", "gpipe", "--event",
                         "at=100s,link=east-west,down=1e11s", "--out", str(tmp_path / "b")])
    assert code == 0, err  # the outage begins after the run: nothing waits for it


@pytest.mark.timeout(120)
def test_an_outage_costs_the_simulator_no_rounds() -> None:
    """Rounds of TCP on a link that is down moved nothing and cost an event every round
    trip: a 1,000 s outage was 25,000 rounds (a day's, 2 million)."""
    inputs = load_inputs(TWO_DC, sets=("iterations=3",))
    policy = training_policy("gpipe")
    plan = plan_with_simulator(policy, inputs.topology, inputs.job)

    def events(outage: str) -> tuple[int, float]:
        event = parse_event_flag(f"at=0.01s,link=east-west,down={outage}", inputs.topology)
        result = Simulator(inputs.topology, inputs.job, plan, policy, events=[event]).run()
        return result.events, result.spans.last_end()

    short, short_end = events("1s")
    long, long_end = events("1000s")
    assert long_end > 1000 > short_end
    assert long <= short + 10


# --- counts: repeats, a sweep's runs, local workers, requests, seeds ----------------------

@pytest.mark.parametrize("command", [
    ["compare", str(TWO_DC), "-p", "gpipe"],
    ["sweep", str(TWO_DC), "-p", "gpipe", "--vary", "wan.latency=1ms,2ms"],
])
def test_repeats_past_the_limit_are_refused_before_any_run(tmp_path: Path,
                                                           command: list[str]) -> None:
    """`--repeat 1000000000` made a billion runs' specs first: 1.7 GB after a minute."""
    code, _, err = call([*command, "--repeat", "1000000000", "--out", str(tmp_path / "o")])
    assert (code, err) == (2, "testbed: error: --repeat: must be from 1 to 1,000 (testbed's "
                           "limit), got 1,000,000,000\n")
    assert not (tmp_path / "o").exists()


def test_a_sweep_of_more_runs_than_the_limit_is_refused(tmp_path: Path) -> None:
    values = ",".join(f"{i}ms" for i in range(1, 102))
    code, _, err = call(["sweep", str(TWO_DC), "-p", "gpipe", "-p", "1f1b", "--repeat",
                         "500", "--vary", f"wan.latency={values}", "--out",
                         str(tmp_path / "o")])
    assert (code, err) == (2, "testbed: error: --vary: 101 points x 1,000 runs each make "
                           "101,000 runs, more than a sweep takes (100,000, testbed's "
                           "limit)\n")


def test_local_workers_are_at_most_the_cores_and_what_memory_holds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.experiments import sweep_workers

    monkeypatch.setattr(sweep_workers, "cores", lambda: 4)
    monkeypatch.setattr(sweep_workers, "available_memory", lambda: 64 << 30)
    assert sweep_workers.local_workers(3) == (3, None)
    assert sweep_workers.local_workers(24) == (
        4, "24 asked for, 4 run at once: this machine's 4 cores")
    monkeypatch.setattr(sweep_workers, "available_memory", lambda: 16 * 10**8)
    assert sweep_workers.local_workers(24) == (
        3, "24 asked for, 3 run at once: what its 1.6 GB of available memory holds at "
        "500 MB a worker")
    monkeypatch.setattr(sweep_workers, "available_memory", lambda: 1)
    assert sweep_workers.local_workers(24)[0] == 1


def test_a_sweep_says_when_it_runs_fewer_workers_than_asked(tmp_path: Path) -> None:
    code, _, err = call(["sweep", str(TWO_DC), "-p", "gpipe", "--vary",
                         "wan.latency=1ms,2ms", "--workers", "100000", "--out",
                         str(tmp_path / "o")])
    assert code == 0, err
    assert err.startswith("--workers: 100,000 asked for, ")
    assert "run at once: this machine's" in err.splitlines()[0]


def test_an_arrival_rate_past_the_limit_is_refused_up_front(tmp_path: Path) -> None:
    """1e12 requests/s ran out of memory, then hung."""
    code, _, err = call(["simulate", str(ROOT / "topologies" / "paper-3dc.yaml"), "-p",
                         "1f1b", "--pp", "4", "-b", "greedy", "--set",
                         "inference.arrival_rate=1e12/s", "--out", str(tmp_path / "o")])
    assert (code, err) == (2, "testbed: error: --set: inference.arrival_rate: must be from "
                           "0/s to 100,000/s, got '1e12/s'\n")


def test_a_run_that_would_make_more_requests_than_the_limit_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.inference import workload

    job = load_inputs(ROOT / "topologies" / "paper-3dc.yaml").job
    assert job.inference is not None
    monkeypatch.setattr(workload, "MAX_REQUESTS", 100)
    made = workload.arrivals(job.inference, 0)
    assert len([next(made) for _ in range(100)]) == 100
    with pytest.raises(InputError, match=r"^inference.arrival_rate: 10 requests/s make 100 "
                       r"requests by \d.* s of the run, the most one run takes"):
        next(made)


@pytest.mark.parametrize("seed", [str(2**64), str(2**32), "-1"])
def test_a_seed_no_consumer_takes_is_refused_before_the_run(tmp_path: Path, seed: str) -> None:
    """2^64 ran, then failed to write its results.json (JSON's integers end at 2^64)."""
    code, _, err = call(["simulate", str(TWO_DC), "--seed", seed, "--out", str(tmp_path / "o")])
    assert code == 2 and err.startswith("testbed: error: --seed: must be "), err
    assert not (tmp_path / "o").exists()


def test_the_largest_seed_runs_and_is_saved(tmp_path: Path) -> None:
    import json

    code, _, err = call(["simulate", str(TWO_DC), "-p", "gpipe", "--seed", str(2**32 - 1),
                         "--jitter", "10%", "--out", str(tmp_path / "o")])
    assert code == 0, err
    assert json.loads((tmp_path / "o" / "results.json").read_text())["seed"] == 2**32 - 1


# --- a plan's connections ---------------------------------------------------------------

def _plan_csv(tmp_path: Path, pair: str, count: str) -> Path:
    code, _, err = call(["plan", str(TWO_DC), "-p", "gpipe", "--csv", str(tmp_path / "p.csv")])
    assert code == 0, err
    text = (tmp_path / "p.csv").read_text()
    assert "conn,east-0,west-0,1\n" in text
    path = tmp_path / "edited.csv"
    path.write_text(text.replace("conn,east-0,west-0,1\n", f"conn,{pair},{count}\n"))
    return path


def _line_of(path: Path, start: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1)
                if line.startswith(start))


def test_a_given_plans_connections_are_bounded_as_a_policys_are(tmp_path: Path) -> None:
    """`conn,east-0,west-0,100000000` was accepted; `up --plan` grew a worker to 1.66 GB
    and ended in a TimeoutError. The bound is the one Atlas chooses within (open files,
    TCP memory for full send buffers), at the end that allows more."""
    from testbed.plan.host_limits import this_machine

    path = _plan_csv(tmp_path, "east-0,west-0", "100000000")
    line = _line_of(path, "conn,east-0,west-0,")
    allowed = this_machine().connections_per_peer(4 << 20)
    code, _, err = call(["simulate", str(TWO_DC), "--plan", str(path), "--out",
                         str(tmp_path / "o")])
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(
        f"testbed: error: {path}: line {line} (east-0 and west-0): invalid plan: east-0 and "
        f"west-0 have 100,000,000 TCP connections between them; a worker here may open at "
        f"most {allowed:,} to one peer (an open-file limit of "), err
    fits = _plan_csv(tmp_path, "east-0,west-0", str(allowed))
    code, _, err = call(["simulate", str(TWO_DC), "--plan", str(fits), "--out",
                         str(tmp_path / "fits")])
    assert code == 0, err


def test_a_given_plans_connections_name_gpus_of_the_topology(tmp_path: Path) -> None:
    path = _plan_csv(tmp_path, "east-0,moon-0", "2")
    line = _line_of(path, "conn,east-0,moon-0,")
    code, _, err = call(["plan", str(TWO_DC), "--load", str(path)])
    assert (code, err) == (2, f"testbed: error: {path}: line {line} (east-0 and moon-0): "
                           "invalid plan: connections between east-0 and moon-0: GPU moon-0 "
                           "is not in the topology\n")


def test_a_given_plans_sharing_names_dcs_of_the_topology(tmp_path: Path) -> None:
    """A share row naming a DC the topology lacks (found by fuzzing: the WAN queues' check
    routed to it and raised a KeyError) is refused in one line."""
    path = _plan_csv(tmp_path, "east-0,west-0", "1")
    text = path.read_text()
    assert "share,east,west,fair\n" in text
    path.write_text(text.replace("share,east,west,fair\n", "share,moon,west,fair\n"))
    code, _, err = call(["plan", str(TWO_DC), "--load", str(path)])
    assert (code, err) == (2, f"testbed: error: {path}: invalid plan: sharing names DC "
                           "'moon' of moon>west, not one of the topology's (east, west)\n")


def test_a_policys_connections_past_the_bound_are_refused() -> None:
    code, _, err = call(["plan", str(ROOT / "topologies" / "paper-3dc.yaml"), "-p", "atlas",
                         "-o", "connections=100000", "-o", "selection=off"])
    assert code == 2 and "have 100,000 TCP connections between them" in err, err


def test_the_memory_check_counts_the_plans_connections() -> None:
    from testbed.emulator.backend import memory_record
    from testbed.emulator.runtime.coordinator.memory import (
        CONNECTION_BYTES,
        MemoryPlan,
        check_memory,
        predict_memory,
    )

    inputs = load_inputs(TWO_DC)
    plan = plan_with_simulator(training_policy("gpipe"), inputs.topology, inputs.job)
    few = predict_memory(inputs.topology, inputs.job, plan, "emulated", 0)
    more = dataclasses.replace(plan, connections={**plan.connections,
                                                  ("east-0", "west-0"): 5000})
    many = predict_memory(inputs.topology, inputs.job, more, "emulated", 0)
    assert many.connections == few.connections + 4999
    assert many.total - few.total == 4999 * CONNECTION_BYTES
    assert (memory_record(None, many)["predicted"]["connections_bytes"]
            == many.connections * CONNECTION_BYTES)
    memory = MemoryPlan("emulated", 4, 2**20, 0, 0, 0, 0, 0, 5, connections=100_000)
    with pytest.raises(InputError, match=r"100,000 connections 1.64 GB\); this machine has "
                       r"105 MB available \(MemAvailable\); try 93,856 fewer TCP connections$"):
        check_memory(memory, 100 * 2**20, "t.yaml")


# --- span times `profile` reads ------------------------------------------------------------

def _spans_file(tmp_path: Path, times: list[tuple[object, object]]) -> Path:
    rows = ", ".join(
        f'{{"gpu": "east-{i % 2}", "kind": "{("forward", "backward")[i % 2]}", "start": '
        f'{start}, "end": {end}, "stage": {i % 2}, "iteration": {1 + i // 2}}}'
        for i, (start, end) in enumerate(times))
    run = tmp_path / "run"
    run.mkdir()
    (run / "spans.json").write_text(f'{{"start": 0, "spans": [{rows}]}}')
    return run


@pytest.mark.parametrize(("times", "key", "problem"), [
    ([("-1e308", "1e308")], "spans[0].start", "-1e+308 s is past the times a run has"),
    ([("0", "1.7e308")] * 16, "spans[0].end", "1.7e+308 s is past the times a run has"),
    ([("0", "1" + "0" * 400)], "spans[0].end", "expected number, got an integer of 401 "
                                               "digits"),
    ([("1", "2"), ("0", "2e10")], "spans[1].end", "2e+10 s is past the times a run has (at "
                                                  "most 1e+10 s from its start)"),
])
def test_profile_refuses_span_times_no_run_has(tmp_path: Path, times: list[tuple[str, str]],
                                               key: str, problem: str) -> None:
    """Extreme times went through statistics into a traceback (an overflow to inf, then
    NaN)."""
    run = _spans_file(tmp_path, list(times))
    code, _, err = call(["profile", str(run), "-o", str(tmp_path / "p.json")])
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"testbed: error: {run / 'spans.json'}: {key}: {problem}"), err
    assert not (tmp_path / "p.json").exists()


def test_profile_reads_span_times_within_a_runs(tmp_path: Path) -> None:
    run = _spans_file(tmp_path, [("0", "1e10"), ("-5", "1e10")])
    code, _, err = call(["profile", str(run), "-o", str(tmp_path / "p.json")])
    assert code == 0, err


# --- a checkpoint's inputs, as they were ----------------------------------------------------

@pytest.mark.parametrize(("name", "old", "new"), [
    ("topology.yaml", "gpus: 2", "gpus: 3"),
    ("job.yaml", "iterations: 3", "iterations: 5"),
    ("plan.csv", "conn,east-0,west-0,1", "conn,east-0,west-0,2"),
])
def test_a_checkpoint_whose_inputs_were_edited_is_not_resumed(
        tmp_path: Path, name: str, old: str, new: str) -> None:
    """An edited topology resumed a run that reported `ok` with 0 iterations done."""
    from testbed.emulator.resume import load_resumption, save_settings
    from testbed.run.checkpoint import Progress
    from testbed.run.spec import RunSpec

    inputs = load_inputs(TWO_DC)
    plan = plan_with_simulator(training_policy("gpipe"), inputs.topology, inputs.job)
    spec = RunSpec.build("emulate", inputs.topology, inputs.job, policy="gpipe", plan=plan,
                         plan_file="p.csv", checkpoint_every=1)
    save_settings(tmp_path, spec, "emulated", 1)
    folder = tmp_path / "checkpoint"
    (folder / "state.json").write_text(Progress(1, {}, [], 1, 1).as_json())  # owner gone
    resumed, _ = load_resumption(tmp_path)
    assert resumed.topology == inputs.topology
    edited = folder / name
    assert old in edited.read_text()
    edited.write_text(edited.read_text().replace(old, new, 1))
    with pytest.raises(InputError) as refused:
        load_resumption(tmp_path)
    assert str(refused.value) == (
        f"{edited}: changed since the run was checkpointed (its digest in run.json "
        "differs): a resumed run must be the run it was; start a new run to run another")


# --- plugin code that ends the command ------------------------------------------------------

def test_a_plugin_whose_summary_exits_is_listed_broken_with_every_other(
        hostile_plugin_path: Path) -> None:
    """Its SystemExit emptied `testbed plugins`, exit 0."""
    import json

    from .test_plugins import run_testbed

    done = run_testbed(["plugins", "--json"], hostile_plugin_path)
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows["summary-exits"]["status"].startswith("broken: SystemExit: 0 (at ")
    assert rows["gpipe"]["status"] == "ok" and rows["gpipe"]["summary"]
    text = run_testbed(["plugins"], hostile_plugin_path)
    assert text.returncode == 0 and "summary-exits" in text.stdout and "atlas" in text.stdout
    chosen = run_testbed(["plan", str(TWO_DC), "-p", "summary-exits"], hostile_plugin_path)
    assert chosen.returncode == 1
    assert chosen.stderr.startswith("testbed: error: training policy 'summary-exits' from "
                                    "hostile-policies is broken: SystemExit: 0 (at ")


def test_a_base_exception_of_a_plugins_own_is_its_error(hostile_plugin_path: Path) -> None:
    """It escaped the guard with a traceback."""
    from .test_plugins import run_testbed

    done = run_testbed(["plan", str(TWO_DC), "-p", "raises-its-own"], hostile_plugin_path)
    assert done.returncode == 1
    assert done.stderr.startswith("testbed: error: policy 'raises-its-own' failed while "
                                  "planning: Escape: out of here (at "), done.stderr
    assert done.stderr.count("\n") == 1


# --- --ray addresses ---------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("address", ["127.0.0.1:-5", ":", "127.0.0.1:0", "127.0.0.1:65536",
                                     "east", "ray://:10001", "a b:1"])
def test_a_ray_address_ray_would_not_take_is_refused_before_ray_sees_it(
        tmp_path: Path, address: str) -> None:
    """`127.0.0.1:-5` had Ray retry for ever; `:` printed Ray's traceback."""
    code, _, err = call(["sweep", str(TWO_DC), "-p", "gpipe", "--vary", "wan.latency=1ms,2ms",
                         "--ray", address, "--out", str(tmp_path / "o")])
    assert (code, err) == (2, "testbed: error: --ray: expected HOST:PORT (a port from 1 to "
                           "65535), ray://HOST:PORT, auto or local, got "
                           f"{address!r}\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.timeout(60)
def test_something_not_ray_at_the_address_is_refused_within_the_probe() -> None:
    """A service that is not Ray's (here an HTTP/1 server) had Ray retry for minutes."""
    import http.server
    import threading

    from testbed.experiments.sweep_workers import _reachable

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        with pytest.raises(InputError) as refused:
            _reachable(address)
        assert str(refused.value) == (f"--ray: what answers at {address!r} is not a Ray "
                                      "cluster (it does not speak gRPC)")
    finally:
        server.shutdown()
        server.server_close()


# --- a sweep's saved points ------------------------------------------------------------------

SWEEP = ["sweep", str(TWO_DC), "-p", "gpipe", "-p", "1f1b", "--vary", "wan.latency=1ms,2ms",
         "--iterations", "2", "--workers", "1"]


def _resaved(line: str, fingerprint: str, change: dict[str, object]) -> str:
    """A line changed, and its digest made again as the sweep makes it: what only the
    checks of its rows can tell apart."""
    import json

    from testbed.experiments.sweep_store import _digest

    item = json.loads(line)
    item["rows"][0].update(change)
    body = {key: item[key] for key in ("index", "values", "rows")}
    return json.dumps({**body, "digest": _digest(fingerprint, body)})


@pytest.mark.timeout(240)
def test_a_sweep_goes_on_only_with_the_lines_it_wrote(tmp_path: Path) -> None:
    """Lines of another policy, of made-up or NaN figures, or not written by this sweep
    were taken as its points: each is said, and its point runs again."""
    import json

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for out in (whole, cut):
        code, _, err = call([*SWEEP, "--out", str(out)])
        assert code == 0, err
    saved = cut / "points.jsonl"
    first, second = saved.read_text().splitlines()
    fingerprint = json.loads((cut / "sweep.json").read_text())["fingerprint"]
    made_up = json.loads(first)
    made_up["rows"][0]["iteration_s"] = 0.001
    cases = {
        "its policy": (_resaved(first, fingerprint, {"policy": "atlas"}),
                       "point 1 a row of policy 'atlas' where the point runs 'gpipe'"),
        "NaN": (_resaved(second, fingerprint, {"iteration_s": float("nan")}),
                "point 2 a row whose iteration_s is nan, not a finite number"),
        "a made-up figure": (json.dumps(made_up),
                             "point 1 not written by this sweep, or changed since"),
        "a key of its own": (_resaved(first, fingerprint, {"extra": 1}),
                             "point 1 a row with 'extra', which a sweep's rows do not have"),
    }
    for name, (line, note) in cases.items():
        saved.write_text(line + "\n")
        (cut / "sweep.csv").unlink()
        code, _, err = call([*SWEEP, "--out", str(cut)])
        assert code == 0, err
        assert f"points.jsonl line 1: {note}: not taken, it runs again\n" in err, (name, err)
        assert "going on with" not in err, name
        assert (cut / "sweep.csv").read_text() == (whole / "sweep.csv").read_text(), name


@pytest.mark.timeout(120)
def test_a_sweep_refuses_saved_points_that_are_not_a_file(tmp_path: Path) -> None:
    """A FIFO in points.jsonl's place hung the sweep opening it."""
    import os

    out = tmp_path / "out"
    code, _, err = call([*SWEEP, "--out", str(out)])
    assert code == 0, err
    (out / "points.jsonl").unlink()
    os.mkfifo(out / "points.jsonl")
    code, _, err = call([*SWEEP, "--out", str(out)])
    assert (code, err) == (2, f"testbed: error: {out / 'points.jsonl'}: is a pipe: expected a "
                           "file: not one this testbed wrote; give a new --out, or --force to "
                           "start over\n")
    code, _, err = call([*SWEEP, "--out", str(out), "--force"])
    assert code == 0, err


# --- the dilation a machine-bound run suggests ---------------------------------------------

def test_the_suggested_dilation_is_at_most_the_most_allowed() -> None:
    """`try --dilation 5096` was suggested, and --dilation refuses past 64."""
    from testbed.emulator.backend import emulation_record
    from testbed.emulator.runtime.coordinator.health import assess
    from testbed.run.dilation import MAX_DILATION
    from testbed.run.spec import parse_dilation

    behind = assess(1.0, [0.001], None, dilation=1).behind(3000.0, 1.0)
    assert (behind.suggested_dilation, behind.needed_dilation) == (MAX_DILATION, 5000)
    assert parse_dilation(str(behind.suggested_dilation)) == MAX_DILATION
    assert (behind.warning() or "").endswith(
        "try --dilation 64, the most allowed, though it needs about 5,000: even that may not "
        "be enough (fewer GPUs, or `testbed simulate`)")
    assert emulation_record(behind)["needed_dilation"] == 5000
    at_most = assess(1.0, [0.001], None, dilation=64)
    assert at_most.suggested_dilation == 64 and at_most.needed_dilation == 107
    assert (at_most.warning() or "").endswith(
        "it ran at --dilation 64, the most allowed, and needs about 107: use fewer GPUs, or "
        "`testbed simulate`")
    within = assess(1.0, [0.001], None, dilation=2).behind(3.0, 1.0)
    assert within.suggested_dilation == within.needed_dilation == 10
    assert (within.warning() or "").endswith("try --dilation 10")


# --- recovery times --------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "key", "problem"), [
    ("recovery: {restart: 1e300s}", "recovery.restart", "must be from 0s to 86400s, got "
                                                        "'1e300s'"),
    ("recovery: {detect: 2d}", "recovery.detect", "unknown time unit"),
    ("recovery: {detect: -1s}", "recovery.detect", "must not be negative"),
    ("failures: [{at: 1s, worker: east-1, back: 1e300s}]", "failures[0].back",
     "must be from 0s to 1e+10s, got '1e300s'"),
    ("failures: [{at: 2e10s, worker: east-1}]", "failures[0].at",
     "must be from 0s to 1e+10s, got '2e10s'"),
])
def test_recovery_times_past_their_bounds_are_refused(tmp_path: Path, text: str, key: str,
                                                      problem: str) -> None:
    """1e300 s of restart was taken, and summarized in 301 digits."""
    path = _file(tmp_path, "s.yaml", text)
    with pytest.raises(InputError) as refused:
        load_scenario(path, load_topology(TWO_DC))
    assert str(refused.value).startswith(f"{path}: {key}: {problem}"), str(refused.value)


def test_a_day_of_recovery_is_taken(tmp_path: Path) -> None:
    path = _file(tmp_path, "s.yaml", "recovery: {detect: 86400s, restart: 0s}\n"
                 "failures: [{at: 1s, worker: east-1, back: 1e10s}]")
    scenario, _ = load_scenario(path, load_topology(TWO_DC))
    assert (scenario.recovery.detect_s, scenario.recovery.restart_s) == (86400.0, 0.0)
    assert scenario.failures[0].back_s == 1e10


# --- results.json's schema ---------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "problem"), [
    ("iterations", -3, "must be at least 0, got int -3"),
    ("iterations_requested", 0, "must be at least 1, got int 0"),
    ("seed", -1, "must be at least 0, got int -1"),
    ("tokens.measured", -5, "must be at least 0, got int -5"),
    ("iteration_time_s.median", -0.5, "must be at least 0, got float -0.5"),
    ("inference.requests", -1, "must be at least 0, got int -1"),
    ("wan.bytes", -1, "must be at least 0, got int -1"),
    ("cycle_time_s.period", 0, "must be at least 1, got int 0"),
])
def test_the_schema_refuses_counts_and_times_below_zero(tmp_path: Path, key: str, value: int,
                                                        problem: str) -> None:
    """`"iterations": -3` validated."""
    import json

    import jsonschema

    from testbed.report.results_schema import shipped_schema

    code, _, err = call(["simulate", str(TWO_DC), "-p", "gpipe", "--out", str(tmp_path / "o")])
    assert code == 0, err
    path = tmp_path / "o" / "results.json"
    data = json.loads(path.read_text())
    jsonschema.validate(data, shipped_schema())
    *parents, last = key.split(".")
    node = data
    for parent in parents:
        node = node[parent]
    node[last] = value
    path.write_text(json.dumps(data))
    code, _, err = call(["results", "validate", str(path)])
    assert (code, err) == (2, f"testbed: error: {path}: {key}: {problem}\n")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, shipped_schema())


# --- the probes, as scripts/soak.py runs them ------------------------------------------------

@pytest.mark.benchmark
@pytest.mark.timeout(1800)
def test_every_bounds_probe_holds(tmp_path: Path) -> None:
    """scripts/soak_faults.py's probes of input past its bounds (`soak.py --only bounds`,
    no root needed), as a user would type each: one line and its exit status, or the run
    going on, each within its time."""
    module = script("soak_faults")
    report = module.run_probes(module.bounds_probes(), tmp_path)
    assert report["failures"] == 0, report["details"]
    assert report["cases"] >= 19
