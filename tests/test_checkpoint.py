"""Checkpoint bookkeeping: when one is due, when it is complete, what it carries over, and
what resuming refuses."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from testbed.common.owners import process_start_ticks
from testbed.emulator.resume import load_resumption
from testbed.errors import InputError
from testbed.run.checkpoint import (
    Checkpoints,
    Progress,
    checkpoint_due,
    iteration_dir,
    prior_elapsed,
    read_progress,
    stage_file,
)


def test_a_checkpoint_is_due_every_n_and_at_the_end() -> None:
    due = [done for done in range(11) if checkpoint_due(done, 3, 10)]
    assert due == [3, 6, 9, 10]
    assert not any(checkpoint_due(done, 0, 10) for done in range(11))


def test_a_plan_that_spans_iterations_checkpoints_between_its_cycles() -> None:
    """A sync started in one iteration of a cycle may end in a later one: only a cycle's
    end is a cut every worker can resume from."""
    assert [done for done in range(12) if checkpoint_due(done, 4, 11, period=2)] == [4, 8]
    from testbed.emulator.resume import check_checkpointable
    from testbed.job.model import Job, ModelShape
    from testbed.plan.build import Schedule, build_plan
    from testbed.plan.collective import Collective, Reduces
    from testbed.plan.cycles import cycled
    from testbed.plan.model import Action, Op
    from testbed.run.spec import RunSpec
    from testbed.topology import load_topology
    from tests.conftest import TOPOLOGIES

    topology = load_topology(TOPOLOGIES / "two-dc.yaml")
    job = Job(model=ModelShape(layers=4, hidden=64, heads=4, seq_len=32, vocab=256),
              microbatches=2)
    inner = build_plan("t", topology, job, {(0, 0): ("east-0",), (1, 0): ("west-0",)},
                       Schedule.GPIPE, gradients=None)
    sync = [Action(0, Op.ALLREDUCE, None, Collective(Reduces.DELTAS)), Action(0, Op.OUTER_STEP)]
    plan = cycled(inner, [lambda s: [], lambda s: [], lambda s: sync])
    spec = RunSpec.build("emulate", topology, job, policy="t", checkpoint_every=6)
    check_checkpointable(spec, plan)
    with pytest.raises(InputError, match=r"^--checkpoint-every: 4 is not a multiple of the "
                                         r"plan's cycle of 3 iterations"):
        check_checkpointable(RunSpec.build("emulate", topology, job, policy="t",
                                           checkpoint_every=4), plan)


def _span(gpu: str, iteration: int, start: float, end: float, kind: str = "step") -> dict[
        str, object]:
    return {"gpu": gpu, "kind": kind, "iteration": iteration, "start": start, "end": end}


def test_only_a_checkpoint_every_worker_wrote_is_committed(tmp_path: Path) -> None:
    checkpoints = Checkpoints(tmp_path, 2, 2, 1, 1)
    iteration_dir(tmp_path, 2).mkdir()
    assert not checkpoints.part_written(2, "a")
    assert not checkpoints.part_written(2, "a")  # the same worker twice is still one part
    assert read_progress(tmp_path) is None
    assert checkpoints.part_written(2, "b")
    spans = [_span("a", i, 100 + i, 100.5 + i) for i in range(3)]
    checkpoints.commit(2, {0: 5.0, 1: 4.0, 2: 3.0}, spans, start=100.0)
    progress = read_progress(tmp_path)
    assert progress is not None and progress.completed == 2
    assert progress.losses == {0: 5.0, 1: 4.0}  # iteration 2 is not in the checkpoint
    assert [(s["start"], s["end"]) for s in progress.spans] == [(0.0, 0.5), (1.0, 1.5)]
    iteration_dir(tmp_path, 4).mkdir()
    checkpoints.commit(4, {}, [], start=100.0)
    assert [p.name for p in tmp_path.glob("it*")] == ["it4"]  # the older one is gone


def test_a_commit_leaves_the_newer_checkpoints_workers_are_writing(tmp_path: Path) -> None:
    """Workers go on while a commit is written: on a busy machine they wrote their parts
    of 4 and 6 before 2's commit dropped the older checkpoints, and 6 is the one the run
    ends on."""
    checkpoints = Checkpoints(tmp_path, 2, 1, 1, 1)
    for done in (2, 4, 6):
        iteration_dir(tmp_path, done).mkdir()
        stage_file(iteration_dir(tmp_path, done), 0, 0).write_bytes(b"saved")
    (tmp_path / "moved-1").mkdir()  # a replanned run's moved state: the run's to remove
    for done in (2, 4, 6):
        checkpoints.commit(done, {}, [], start=100.0)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["it6", "moved-1"]
    assert stage_file(iteration_dir(tmp_path, 6), 0, 0).read_bytes() == b"saved"


def test_a_resumed_run_carries_the_earlier_iterations_first(tmp_path: Path) -> None:
    prior = Progress(2, {0: 5.0, 1: 4.0}, [_span("a", 0, 0, 1), _span("a", 1, 1, 2.5)], 1, 1,
                     [2])
    assert prior_elapsed(prior) == 2.5
    checkpoints = Checkpoints(tmp_path, 2, 1, 1, 1, prior)
    checkpoints.commit(4, {2: 3.0, 3: 2.0}, [_span("a", 2, 50, 51), _span("a", 3, 51, 52)], 50)
    progress = read_progress(tmp_path)
    assert progress is not None
    assert progress.losses == {0: 5.0, 1: 4.0, 2: 3.0, 3: 2.0}
    assert [s["end"] for s in progress.spans] == [1, 2.5, 3.5, 4.5]
    assert progress.resumed_at == [2]


SETTINGS = {"format": 1, "policy": "gpipe", "policy_options": {}, "compute": "emulated",
            "shaper": "auto", "allreduce": "auto", "stall_timeout_s": 120.0, "pacing": True,
            "activations": "auto", "dilation": 1, "checkpoint_every": 2}


def _run_dir(tmp_path: Path, progress: Progress, settings_format: int = 1) -> Path:
    folder = tmp_path / "checkpoint"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({**SETTINGS, "format": settings_format}))
    (folder / "state.json").write_text(progress.as_json())
    return tmp_path


def test_resuming_refuses_a_live_run_and_an_unknown_format(tmp_path: Path) -> None:
    pid = os.getpid()
    live = Progress(2, {}, [], pid, process_start_ticks(pid) or 0)
    with pytest.raises(InputError, match="still going"):
        load_resumption(_run_dir(tmp_path / "live", live))
    with pytest.raises(InputError, match=r"run\.json: format: format 9 is not 1"):
        load_resumption(_run_dir(tmp_path / "future", live, settings_format=9))
    with pytest.raises(InputError, match="no checkpointed run"):
        load_resumption(tmp_path)
    broken = tmp_path / "broken" / "checkpoint"
    broken.mkdir(parents=True)
    (broken / "run.json").write_text("{")
    with pytest.raises(InputError, match=r"run\.json: unreadable"):
        load_resumption(broken.parent)


def _saved(tmp_path: Path, state: dict[str, object] | None = None,
           settings: dict[str, object] | None = None, raw_state: str | None = None) -> Path:
    good = Progress(3, {0: 5.0, 1: 4.0, 2: 3.0}, [_span("east-0", i, i, i + 0.5)
                                                  for i in range(3)], 1, 1, [])
    folder = tmp_path / "checkpoint"
    folder.mkdir(parents=True)
    data = {**json.loads(good.as_json()), **(state or {})}
    (folder / "state.json").write_text(raw_state or json.dumps(data))
    (folder / "run.json").write_text(json.dumps(SETTINGS if settings is None else settings))
    return tmp_path


@pytest.mark.parametrize(("state", "settings", "where", "problem"), [
    ({"spans": [{"gpu": "east-0", "kind": "step", "iteration": 0, "start": 0}]}, None,
     "state.json: spans[0].end", "missing value"),
    ({"spans": [_span("east-0", 0, 2.0, 1.0)]}, None, "state.json: spans[0].end",
     "before the span's start"),
    ({"spans": [_span("east-0", 7, 0, 1)]}, None, "state.json: spans[0].iteration",
     "not an iteration before 3"),
    ({"spans": [{**_span("east-0", 0, 0, 1), "kind": "nap"}]}, None,
     "state.json: spans[0].kind", "expected one of forward"),
    ({"completed": -3}, None, "state.json: completed", "must be positive"),
    ({"completed": "3"}, None, "state.json: completed", "expected a whole number"),
    ({"losses": {"x": 1.0}}, None, "state.json: losses.x", "expected a whole number"),
    ({"losses": {"3": 1.0}}, None, "state.json: losses.3", "not an iteration from 0"),
    ({"losses": {"0": "low"}}, None, "state.json: losses.0", "expected a number"),
    ({"owner": {"pid": 1}}, None, "state.json: owner.start_ticks", "missing value"),
    ({"resumed_at": [0]}, None, "state.json: resumed_at[0]", "not an iteration from 1"),
    ({"extra": 1}, None, "state.json: extra", "unknown key"),
    ({"format": 2}, None, "state.json: format", "format 2 is not 1"),
    (None, {k: v for k, v in SETTINGS.items() if k != "pacing"}, "run.json: pacing",
     "missing value"),
    (None, {**SETTINGS, "dilation": -4}, "run.json: dilation", "must be from 1 to 64, got -4"),
    (None, {**SETTINGS, "compute": "gpu"}, "run.json: compute", "one of emulated, real"),
    (None, {**SETTINGS, "stall_timeout_s": 0}, "run.json: stall_timeout_s", "must be positive"),
    (None, {**SETTINGS, "pacing": "yes"}, "run.json: pacing", "expected true or false"),
    (None, {**SETTINGS, "policy_options": {"connections": 4}},
     "run.json: policy_options.connections", "expected text"),
    (None, {**SETTINGS, "spare": 1}, "run.json: spare", "unknown key"),
])
def test_damaged_saved_state_is_refused_naming_file_and_key(
        tmp_path: Path, state: dict[str, object] | None, settings: dict[str, object] | None,
        where: str, problem: str) -> None:
    run = _saved(tmp_path, state, settings)
    with pytest.raises(InputError) as caught:
        load_resumption(run)
    message = str(caught.value)
    assert f"{run / 'checkpoint'}/{where}: " in message and problem in message, message
    assert "\n" not in message


def test_a_nan_span_end_is_refused_and_a_nan_loss_is_kept(tmp_path: Path) -> None:
    good = _saved(tmp_path / "a")
    state = good / "checkpoint" / "state.json"
    state.write_text(state.read_text().replace('"0": 5.0', '"0": NaN'))
    progress = read_progress(good / "checkpoint")
    assert progress is not None and math.isnan(progress.losses[0])
    assert json.loads(progress.as_json())["losses"]["0"] is None  # written back as null
    bad = _saved(tmp_path / "b")
    state = bad / "checkpoint" / "state.json"
    state.write_text(state.read_text().replace('"end": 0.5', '"end": NaN', 1))
    with pytest.raises(InputError, match=r"spans\[0\]\.end: expected a finite number"):
        read_progress(bad / "checkpoint")


def test_run_json_reads_back_what_a_run_saved(tmp_path: Path) -> None:
    from testbed.emulator.resume import read_settings, save_settings
    from testbed.experiments.inputs import load_inputs
    from testbed.policy.loss_models import DEFAULT_LOSS_MODEL
    from testbed.run.spec import RunSpec

    inputs = load_inputs(Path(__file__).resolve().parent.parent / "topologies" / "two-dc.yaml")
    spec = RunSpec.build("emulate", inputs.topology, inputs.job, policy="atlas",
                         policy_options={"connections": "4"}, stall_timeout_s=30.0, pacing=False,
                         checkpoint_every=3, target_loss=2.5)
    save_settings(tmp_path, spec, "real", 4)
    settings = read_settings(tmp_path / "checkpoint" / "run.json")
    digests = settings.pop("digests")
    assert set(digests) == {"topology.yaml", "job.yaml"}  # no plan: the policy plans again
    assert settings == {"policy": "atlas", "policy_options": {"connections": "4"},
                        "compute": "real", "shaper": "auto", "allreduce": "auto",
                        "stall_timeout_s": 30.0, "pacing": False, "activations": "auto",
                        "dilation": 4, "checkpoint_every": 3, "target_loss": 2.5,
                        "loss_model": DEFAULT_LOSS_MODEL, "timed": False, "plan_file": None}
    saved = json.loads((tmp_path / "checkpoint" / "run.json").read_text())
    (tmp_path / "checkpoint" / "run.json").write_text(json.dumps({**saved, "loss_model": "fit"}))
    assert read_settings(tmp_path / "checkpoint" / "run.json")["loss_model"] == "fit"
    del saved["target_loss"], saved["loss_model"]  # saved before runs had them
    (tmp_path / "checkpoint" / "run.json").write_text(json.dumps(saved))
    before = read_settings(tmp_path / "checkpoint" / "run.json")
    assert (before["target_loss"], before["loss_model"]) == (None, DEFAULT_LOSS_MODEL)


def test_a_run_with_events_or_a_scenario_is_not_resumed(tmp_path: Path) -> None:
    """Its events' times would start again with the resumed run: only its own recovery
    (--on-failure restart|replan) checkpoints it, and --resume refuses it."""
    from testbed.emulator.resume import check_checkpointable, load_resumption, save_settings
    from testbed.experiments.inputs import load_inputs
    from testbed.run.spec import RunSpec

    topology = Path(__file__).resolve().parent.parent / "topologies" / "two-dc.yaml"
    inputs = load_inputs(topology, events=("at=1s,link=east-west,down=1s",))
    spec = RunSpec.build("emulate", inputs.topology, inputs.job, policy="gpipe",
                         events=inputs.events, checkpoint_every=2)
    from testbed.experiments.planning import plan_with_simulator
    from testbed.policy import training_policy

    plan = plan_with_simulator(training_policy("gpipe"), inputs.topology, inputs.job)
    with pytest.raises(InputError, match="network events is not supported"):
        check_checkpointable(spec, plan)
    recovering = RunSpec.build("emulate", inputs.topology, inputs.job, policy="gpipe",
                               events=inputs.events, checkpoint_every=2, on_failure="replan")
    check_checkpointable(recovering, plan)
    save_settings(tmp_path, recovering, "emulated", 1)
    with pytest.raises(InputError, match=r"run\.json: timed: the run had network events"):
        load_resumption(tmp_path)
