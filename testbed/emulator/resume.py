"""Checkpointed emulated runs: the settings `up --checkpoint-every` writes before training
(with a given plan, the plan itself), and what `up --resume RUN_DIR` reads back to go on
from the newest complete checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, get_args

from testbed.common.choices import ActivationsChoice, AllReduceChoice, EmulatedCompute, ShaperChoice
from testbed.common.codec import JsonObject
from testbed.common.fields import (
    Fields,
    boolean,
    bounded,
    integer,
    number,
    positive,
    string,
    text,
)
from testbed.common.fsutil import own_directory, write_atomic
from testbed.common.input_files import MAX_CSV_BYTES, MAX_YAML_BYTES, read_input
from testbed.common.jsonio import read_json
from testbed.common.owners import process_start_ticks
from testbed.common.yamlio import to_yaml
from testbed.errors import InputError
from testbed.job.load import dump_job, load_job
from testbed.plan.load import load_plan
from testbed.plan.model import Plan
from testbed.plan.text import plan_to_csv
from testbed.policy.loss_models import DEFAULT_LOSS_MODEL
from testbed.policy.option_parsers import one_of
from testbed.run.checkpoint import (
    CHECKPOINT_DIR,
    FORMAT,
    Checkpoints,
    Progress,
    iteration_dir,
    read_progress,
)
from testbed.run.dilation import MAX_DILATION
from testbed.run.spec import RunSpec
from testbed.topology.load import dump_topology, load_topology

SETTINGS_FILE = "run.json"
TOPOLOGY_FILE = "topology.yaml"
JOB_FILE = "job.yaml"
PLAN_FILE = "plan.csv"
"""A given plan (`--plan`), as the run ran it: a resumed run runs it again."""
_SETTINGS = ("policy", "policy_options", "compute", "shaper", "allreduce", "stall_timeout_s",
             "pacing", "activations", "dilation", "checkpoint_every", "target_loss",
             "loss_model")


def check_checkpointable(spec: RunSpec, plan: Plan) -> None:
    """What a resumed run could not reproduce is refused before anything starts."""
    every = spec.common.checkpoint_every
    if every % plan.period:
        raise InputError(f"{every} is not a multiple of the plan's cycle of "
                         f"{plan.period} iterations (checkpoints are taken between cycles, "
                         "when no sync is under way)", "--checkpoint-every")
    if (spec.common.events or spec.scenario) and spec.common.on_failure == "stop":
        raise InputError("checkpointing a run with network events is not supported, nor "
                         "one with a scenario (their times would restart with a resumed "
                         "run), but for --on-failure restart or replan, whose recovery "
                         "carries them over", "--checkpoint-every")
    if spec.common.bubble_policy:
        raise InputError("checkpointing a run that fills bubbles is not supported (its "
                         "inference requests are not carried over)", "--checkpoint-every")


def save_settings(directory: Path, spec: RunSpec, compute: str, dilation: int) -> None:
    """Everything that decides the run, with `auto` choices resolved, so that a resumed
    run is the same run."""
    folder = own_directory(directory, CHECKPOINT_DIR)
    # by name, as read_settings reads them back: RunSpec.build's keyword arguments
    settings: JsonObject = {name: spec.setting(name) for name in _SETTINGS}
    settings.update(format=FORMAT, compute=compute, dilation=dilation,
                    timed=bool(spec.common.events or spec.scenario),
                    plan_file=spec.common.plan_file)
    files = {TOPOLOGY_FILE: to_yaml(dump_topology(spec.topology)),
             JOB_FILE: to_yaml(dump_job(spec.job))}
    if spec.common.plan is not None:
        files[PLAN_FILE] = plan_to_csv(spec.common.plan)
    for name, content in files.items():
        write_atomic(folder / name, content, 0o644)
    settings["digests"] = {name: _digest(content) for name, content in files.items()}
    write_atomic(folder / SETTINGS_FILE, json.dumps(settings, indent=1), 0o644)


def _digest(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


def check_unchanged(folder: Path, digests: dict[str, str] | None) -> None:
    """The topology, job and plan the checkpoints were taken with, as written: a resumed
    run is the run it was (an edited topology resumed a run that reported `ok` with no
    iteration done). Checkpoints written before runs kept digests are not checked."""
    for name, digest in (digests or {}).items():
        limit = MAX_CSV_BYTES if name == PLAN_FILE else MAX_YAML_BYTES
        if _digest(read_input(folder / name, limit)) != digest:
            raise InputError(f"changed since the run was checkpointed (its digest in "
                             f"{SETTINGS_FILE} differs): a resumed run must be the run it "
                             "was; start a new run to run another", str(folder / name))


def checkpoints_for(directory: Path, every: int, workers: int,
                    prior: Progress | None) -> Checkpoints:
    pid = os.getpid()
    return Checkpoints(directory / CHECKPOINT_DIR, every, workers, pid,
                       process_start_ticks(pid) or 0, prior)


def load_resumption(directory: Path) -> tuple[RunSpec, Progress]:
    """The run's spec and the progress it resumes from, every saved file checked (types
    and ranges) before anything is made; a located InputError where one is not right."""
    folder = directory / CHECKPOINT_DIR
    settings_path = folder / SETTINGS_FILE
    if not settings_path.is_file():
        raise InputError(f"{directory} holds no checkpointed run (no {CHECKPOINT_DIR}/"
                         f"{SETTINGS_FILE}; was it started with --checkpoint-every?)", "--resume")
    settings = read_settings(settings_path)
    if settings.pop("timed"):
        raise InputError("the run had network events or a scenario, whose times a resumed "
                         "run cannot carry over; start it again", str(settings_path), "timed")
    progress = read_progress(folder)
    if progress is None:
        raise InputError("no checkpoint was completed before the run ended; start it again",
                         str(folder))
    if process_start_ticks(progress.owner_pid) == progress.owner_ticks:
        raise InputError(f"the run is still going (process {progress.owner_pid}); stop it "
                         "before resuming", str(directory))
    check_unchanged(folder, settings.pop("digests"))
    topology = load_topology(folder / TOPOLOGY_FILE)
    job = load_job(topology.job, topology.source, folder / JOB_FILE, [])
    if progress.completed >= job.iterations:
        raise InputError(f"the run already finished its {job.iterations} iterations",
                         str(directory))
    saved = iteration_dir(folder, progress.completed)
    if settings["compute"] == "real" and not saved.is_dir():
        raise InputError(f"{saved} is missing", str(folder / "state.json"), "completed")
    given = folder / PLAN_FILE
    plan = load_plan(given, topology, job) if given.is_file() else None
    spec = RunSpec.build("emulate", topology, job, **settings, plan=plan)
    progress.resumed_at.append(progress.completed)
    return spec, progress


def _digests(top: Fields) -> dict[str, str] | None:
    """run.json's digests of the files it names (absent: written before it had them)."""
    section = top.section("digests", keys=(TOPOLOGY_FILE, JOB_FILE, PLAN_FILE))
    if section is None:
        return None
    out = {name: section.get(name, text) for name in (TOPOLOGY_FILE, JOB_FILE, PLAN_FILE)
           if section.has(name)}
    section.done()
    return out


def read_settings(path: Path) -> dict[str, Any]:
    """run.json: every setting `save_settings` wrote, each of its type and range (by the
    setting's name: the spec's keyword arguments, each its own field's type)."""
    top = Fields(read_json(path), str(path))
    version = top.get("format", integer)
    if version != FORMAT:
        raise top.error("format", f"format {version} is not {FORMAT}")
    options = top.section("policy_options", required=True)
    assert options is not None
    settings = {
        "policy": top.get("policy", text),
        "policy_options": {key: options.get(key, string) for key in options.data},
        "compute": top.get("compute", one_of(*get_args(EmulatedCompute))),
        "shaper": top.get("shaper", one_of(*get_args(ShaperChoice))),
        "allreduce": top.get("allreduce", one_of(*get_args(AllReduceChoice))),
        "stall_timeout_s": top.get("stall_timeout_s", positive(number)),
        "pacing": top.get("pacing", boolean),
        "activations": top.get("activations", one_of(*get_args(ActivationsChoice))),
        "dilation": top.get("dilation", bounded(integer, 1, MAX_DILATION, str)),
        "checkpoint_every": top.get("checkpoint_every", positive(integer)),
        "target_loss": top.get("target_loss", positive(number), None),  # absent: none
        # absent: written before loss models, when the one model was today's default
        "loss_model": top.get("loss_model", text, DEFAULT_LOSS_MODEL),
        "timed": top.get("timed", boolean, False),  # absent: written before scenarios
        "plan_file": top.get("plan_file", string, None),  # absent or null: the policy's
        "digests": _digests(top),
    }
    top.done()
    return settings
