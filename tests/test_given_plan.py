"""Running a given plan (`--plan FILE`, the Python API's `plan=`): a saved, hand-edited or
torch-written plan runs as written, checked first with one-line errors naming the file
and row; the policy only labels the run and answers its hooks."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from testbed import api
from testbed.emulator.resume import check_checkpointable
from testbed.errors import InputError
from testbed.plan import parse_plan_csv, plan_to_csv
from testbed.run.spec import RunSpec
from testbed.sim.backend import SimulatorBackend
from tests.test_cli import call

ROOT = Path(__file__).resolve().parent.parent
TWO_DC = str(ROOT / "topologies" / "two-dc.yaml")
PAPER = str(ROOT / "topologies" / "paper-3dc.yaml")


def saved_plan(tmp_path: Path, *args: str, topology: str = TWO_DC) -> Path:
    path = tmp_path / "saved.csv"
    code, _, err = call(["plan", topology, *args, "--csv", str(path)])
    assert code == 0, err
    return path


def edit_gpu(path: Path, gpu: str, swap: tuple[str, str], name: str = "edited.csv") -> Path:
    """The plan with two actions of one GPU's list swapped, as a person edits one."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        cells = line.split(",")
        if cells[:2] == ["actions", gpu]:
            a, b = cells.index(swap[0]), cells.index(swap[1])
            cells[a], cells[b] = cells[b], cells[a]
            lines[i] = ",".join(cells)
    edited = path.with_name(name)
    edited.write_text("\n".join(lines) + "\n")
    return edited


def compute_order(spans: list[dict[str, Any]], gpu: str, iteration: int = 0) -> list[str]:
    mine = sorted((s for s in spans if s["gpu"] == gpu and s["iteration"] == iteration
                   and s["kind"] in ("forward", "backward")), key=lambda s: s["start"])
    return [f"{s['stage']}{s.get('part') or s['kind'][0].upper()}{s['microbatch']}"
            for s in mine]


def test_a_hand_edited_plan_runs_as_edited(tmp_path: Path) -> None:
    """The acceptance: `testbed plan ... -p 1f1b --csv`, one GPU's order edited (a third
    warm-up forward on east-0), `testbed simulate --plan`."""
    edited = edit_gpu(saved_plan(tmp_path, "-p", "1f1b"), "east-0", ("0B0", "0F2"))
    out = tmp_path / "run"
    code, text, err = call(["simulate", TWO_DC, "--plan", str(edited), "--out", str(out)])
    assert code == 0, err
    assert "simulate run of 1f1b on two-dc: ok" in text and f"from {edited}" in text
    results = json.loads((out / "results.json").read_text())
    assert results["plan_file"] == str(edited) and results["policy"] == "1f1b"
    spans = json.loads((out / "spans.json").read_text())["spans"]
    assert compute_order(spans, "east-0")[:4] == ["0F0", "0F1", "0F2", "0B0"]
    assert compute_order(spans, "east-1")[:4] == ["0F0", "0F1", "0B0", "0F2"]  # as planned
    saved = parse_plan_csv((out / "plan.csv").read_text())
    assert saved == parse_plan_csv(edited.read_text())


def test_torchs_csv_form_runs_under_plan_file(tmp_path: Path) -> None:
    path = tmp_path / "torch.csv"
    path.write_text("0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n")
    out = tmp_path / "run"
    code, _, err = call(["simulate", TWO_DC, "--plan", str(path), "--out", str(out)])
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    assert results["policy"] == "plan-file" and results["plan"]["policy"] == "torch-csv"
    spans = json.loads((out / "spans.json").read_text())["spans"]
    assert compute_order(spans, "east-0") == [*(f"0F{m}" for m in range(4)),
                                              *(f"0B{m}" for m in range(4))]


def test_a_hand_written_virtual_plan_runs(tmp_path: Path) -> None:
    from tests.test_virtual_stages import SPLIT, _one_gpu

    path = tmp_path / "hand.csv"
    path.write_text(plan_to_csv(replace(_one_gpu(SPLIT), layers=(4, 4), microbatch_size=1)))
    code, _, err = call(["simulate", TWO_DC, "--plan", str(path), "--set", "model=tiny",
                         "--set", "model.layers=8", "--set", "microbatch_size=1",
                         "--out", str(tmp_path / "run")])
    assert code == 0, err
    spans = json.loads((tmp_path / "run" / "spans.json").read_text())["spans"]
    assert compute_order(spans, "east-0") == ["0F0", "1F0", "1I0", "0I0", "1W0", "0W0"]
    assert not [s for s in spans if s["kind"] == "transfer"]


@pytest.mark.parametrize(("swap", "words"), [
    (("0RECV_B0", "0B0"), "line 12 (east-0): invalid plan: east-0: 0B0 runs before 0RECV_B0"),
    (("0ALLREDUCE", "0STEP"), "line 12 (east-0): invalid plan: east-0: 0STEP before"),
])
def test_a_broken_plan_is_one_line_naming_its_file_and_row(tmp_path: Path,
                                                           swap: tuple[str, str],
                                                           words: str) -> None:
    edited = edit_gpu(saved_plan(tmp_path, "-p", "1f1b"), "east-0", swap)
    out = tmp_path / "run"
    code, _, err = call(["simulate", TWO_DC, "--plan", str(edited), "--out", str(out)])
    assert code == 2 and err.count("\n") == 1, err
    assert f"{edited}: {words}" in err
    assert not out.exists()


def test_a_plan_that_does_not_fit_a_gpu_or_the_job_is_refused(tmp_path: Path) -> None:
    plan = saved_plan(tmp_path, "-p", "1f1b")
    code, _, err = call(["simulate", TWO_DC, "--plan", str(plan), "--set", "model.layers=6"])
    assert code == 2 and "meta layers: the plan's stages hold 4 layers (2 2), the job's " \
        "model has 6" in err
    code, _, err = call(["simulate", TWO_DC, "--plan", str(plan), "--set", "microbatch_size=64"])
    assert code == 2 and err.count("\n") == 1, err
    assert "meta microbatch_size: the plan's microbatches are of 2, the job's of 64" in err
    # 4 layers of GPT-3 175B fit an A100 with short sequences, not with 128k tokens of them
    code, _, err = call(["simulate", TWO_DC, "--plan", str(plan), "--set", "model=gpt3-175b",
                         "--set", "model.layers=4", "--set", "model.seq_len=131072"])
    assert code == 2 and err.count("\n") == 1, err
    assert "line 12 (east-0): east-0 needs" in err and "it has 80 GiB (a100)" in err
    code, _, err = call(["simulate", TWO_DC, "--plan", str(plan), "--set", "model=gpt3-175b",
                         "--set", "model.layers=4", "--out", str(tmp_path / "fits")])
    assert code == 0, err


def test_p_labels_a_given_plan_and_answers_its_hooks(tmp_path: Path) -> None:
    plan = saved_plan(tmp_path, "-p", "1f1b")
    code, _, err = call(["simulate", TWO_DC, "--plan", str(plan), "-p", "atlas",
                         "--out", str(tmp_path / "a")])
    assert code == 0, err
    assert json.loads((tmp_path / "a" / "results.json").read_text())["policy"] == "atlas"
    code, _, err = call(["simulate", TWO_DC, "--plan", str(plan), "-p", "atlsa"])
    assert code == 2 and "unknown training policy 'atlsa'" in err
    code, _, err = call(["simulate", TWO_DC, "-p", "plan-file", "--out", str(tmp_path / "b")])
    assert code == 2 and err.count("\n") == 1
    assert "-p plan-file: runs a given plan and makes none: give --plan FILE" in err
    assert not (tmp_path / "b").exists()


def test_compare_runs_plans_beside_policies(tmp_path: Path) -> None:
    edited = edit_gpu(saved_plan(tmp_path, "-p", "1f1b"), "east-0", ("0B0", "0F2"))
    out = tmp_path / "cmp"
    code, _, err = call(["compare", TWO_DC, "-p", "1f1b", "--plan", str(edited),
                            "--out", str(out)])
    assert code == 0, err
    data = json.loads((out / "compare.json").read_text())
    assert [row["combo"] for row in data["rows"]] == ["1f1b", str(edited)]
    assert data["plans"] == [str(edited)]
    ran = {run["policy"]: run["results"] for run in data["runs"]}
    assert ran[str(edited)]["plan_file"] == str(edited) and ran["1f1b"]["plan_file"] is None
    alone = tmp_path / "alone"
    code, _, err = call(["compare", TWO_DC, "--plan", str(edited), "--out", str(alone)])
    assert code == 0, err
    assert [r["combo"] for r in json.loads((alone / "compare.json").read_text())["rows"]] == \
        [str(edited)]


def test_the_api_runs_a_plan_file_or_a_plan(tmp_path: Path) -> None:
    inputs = api.load(TWO_DC)
    path = saved_plan(tmp_path, "-p", "gpipe")
    from_file = api.simulate(inputs, plan=path, out=tmp_path / "file")
    assert from_file.results["policy"] == "gpipe"
    assert from_file.results["plan_file"] == str(path)
    plan = api.plan(inputs, "1f1b")
    given = api.simulate(inputs, plan=plan, out=tmp_path / "plan")
    made = api.simulate(inputs, "1f1b", out=tmp_path / "made")
    assert given.results["plan_file"] is None
    assert given.iteration_s == made.iteration_s
    runs = api.compare(inputs, ["1f1b"], plans=[path, plan, plan], out=tmp_path / "cmp")
    assert list(runs) == ["1f1b", str(path), "plan:1f1b", "plan:1f1b#2"]
    broken = replace(plan, actions={**plan.actions, "east-0": plan.actions["east-0"][1:]})
    with pytest.raises(InputError, match=r"^the given plan of 1f1b: invalid plan: "):
        api.simulate(inputs, plan=broken, out=tmp_path / "broken")


def test_what_a_backend_refuses_of_a_given_plan_names_its_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend names a plan it refuses by its policy (`-p NAME`); for a given plan the
    file is the place to look."""
    def refuse(_self: object, _spec: object, plan: Any, _resume: object) -> None:
        raise InputError("not run here", f"-p {plan.policy}")

    monkeypatch.setattr(SimulatorBackend, "check", refuse)
    path = saved_plan(tmp_path, "-p", "1f1b")
    with pytest.raises(InputError, match=rf"^{path}: not run here$"):
        api.simulate(api.load(TWO_DC), plan=path, out=tmp_path / "run")


def test_a_checkpointed_run_of_a_given_plan_resumes_with_that_plan(tmp_path: Path) -> None:
    """The plan is saved beside the run's settings; `up --resume` runs it again (not the
    policy's plan), checked as a given plan is, and records where it first came from."""
    from testbed.emulator.resume import load_resumption, save_settings
    from testbed.run.checkpoint import CHECKPOINT_DIR, Progress

    inputs = api.load(TWO_DC)
    plan = api.plan(inputs, "gpipe")  # not the policy the run names: 1f1b's would differ
    spec = RunSpec.build("emulate", inputs.topology, inputs.job, policy="1f1b", checkpoint_every=1,
                         plan=plan, plan_file="mine.csv")
    check_checkpointable(spec, plan)
    save_settings(tmp_path, spec, "emulated", 1)
    (tmp_path / CHECKPOINT_DIR / "state.json").write_text(
        Progress(1, {}, [], 1, 1, []).as_json())
    resumed, _ = load_resumption(tmp_path)
    again = resumed.common.plan
    assert again is not None and resumed.common.plan_file == "mine.csv"
    assert again.actions == plan.actions and again.placement == plan.placement
    (tmp_path / CHECKPOINT_DIR / "plan.csv").write_text("meta,layers,1\n")
    with pytest.raises(InputError, match=r"checkpoint/plan\.csv"):
        load_resumption(tmp_path)
