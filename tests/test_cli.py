"""The CLI as a user meets it: help text, one-line errors, exit codes."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, get_args, get_origin, get_type_hints

import click
import pytest
from click.testing import CliRunner

from testbed.cli.main import main

TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"


def call(args: list[str]) -> tuple[int, str, str]:
    runner = CliRunner()
    with runner.isolation() as (out, err, _):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue().decode(), err.getvalue().decode()


def test_help_lists_commands() -> None:
    code, out, _ = call(["--help"])
    assert code == 0
    for command in ("validate", "plan", "plugins"):
        assert command in out


@pytest.mark.parametrize("name", ["two-dc", "paper-3dc", "gpt3-4dc"])
def test_validate_shipped(name: str) -> None:
    code, out, err = call(["validate", str(TOPOLOGIES / f"{name}.yaml")])
    assert code == 0, err
    assert "ok: topology" in out


def test_validate_bad_file_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "datacenters:\n  - {name: east, gpus: 2}\n  - {name: west, gpus: 2}\n"
        "wan:\n  - {between: [east, mars], latency: 20ms, bandwidth: 1Gbit}\n"
    )
    code, out, err = call(["validate", str(path)])
    assert code == 2
    assert err == f"testbed: error: {path}: wan[0].between: unknown datacenter 'mars'\n"
    assert out == ""


def test_validate_flag_override_error() -> None:
    code, _, err = call(["validate", str(TOPOLOGIES / "two-dc.yaml"), "--set", "model.layers=x"])
    assert code == 2
    assert err.startswith("testbed: error: --set: model.layers: expected a whole number")


def test_plan_prints_grid_and_summary(tmp_path: Path) -> None:
    out_csv = tmp_path / "plan.csv"
    code, out, err = call(
        ["plan", str(TOPOLOGIES / "paper-3dc.yaml"), "-p", "1f1b", "--csv", str(out_csv)]
    )
    assert code == 0, err
    assert "r0s0" in out and "policy 1f1b: dp 4 x pp 3" in out
    code, out2, err = call(["plan", str(TOPOLOGIES / "paper-3dc.yaml"), "--load", str(out_csv)])
    assert code == 0, err
    assert out2.splitlines()[:5] == out.splitlines()[:5]


def test_plan_infeasible_job_is_clear() -> None:
    code, _, err = call(["plan", str(TOPOLOGIES / "two-dc.yaml"), "-p", "gpipe", "--dp", "3"])
    assert code == 2
    assert "needs 6 GPUs, the topology has 4" in err


def test_missing_file() -> None:
    code, _, err = call(["validate", "nope.yaml"])
    assert code == 2
    assert err == "testbed: error: nope.yaml: no such file\n"


@pytest.mark.parametrize("value", ["0", "x", "65"])
def test_bad_dilation_is_one_line_exit_2(tmp_path: Path, value: str) -> None:
    code, _, err = call(["compare", str(TOPOLOGIES / "two-dc.yaml"), "-p", "gpipe",
                         "--dilation", value, "--out", str(tmp_path / "c")])
    assert code == 2
    assert err.strip().splitlines() == [
        f"testbed: error: --dilation: must be a whole number from 1 to 64, or auto "
        f"(got {value!r})"]
    assert not (tmp_path / "c").exists()


def test_dilation_is_for_the_emulator(tmp_path: Path) -> None:
    code, _, err = call(["compare", str(TOPOLOGIES / "two-dc.yaml"), "-p", "gpipe",
                         "--dilation", "4", "--out", str(tmp_path / "c")])
    assert code == 2 and "--dilation: applies to --backend emulate only" in err


def test_out_is_not_overwritten_nor_followed(tmp_path: Path) -> None:
    topology = str(TOPOLOGIES / "two-dc.yaml")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "results.json").write_text("{}")
    code, _, err = call(["simulate", topology, "-p", "gpipe", "--out", str(taken)])
    assert code == 2 and "already holds files" in err and "--force" in err
    assert (taken / "results.json").read_text() == "{}"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    code, _, err = call(["simulate", topology, "-p", "gpipe", "--out", str(link)])
    assert code == 2 and "symbolic link" in err
    assert not (tmp_path / "elsewhere").exists()
    code, _, err = call(["simulate", topology, "-p", "gpipe", "--out", str(taken), "--force"])
    assert code == 0, err
    assert (taken / "results.json").read_text() != "{}"


@pytest.mark.usefixtures("clean_host")  # root, to mount a small tmpfs
def test_a_full_disk_is_one_line(tmp_path: Path) -> None:
    import subprocess

    tiny = tmp_path / "tiny"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(tiny)], check=True)
    try:
        code, _, err = call(["simulate", str(TOPOLOGIES / "two-dc.yaml"), "-p", "gpipe",
                             "--out", str(tiny / "run")])
    finally:
        subprocess.run(["umount", str(tiny)], check=True)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("testbed: error: no space left on the device")


@pytest.mark.parametrize("command", ["plan", "simulate", "up", "sweep"])
def test_one_default_policy_shown_in_every_help(command: str) -> None:
    """plan used gpipe, simulate, up and sweep 1f1b, and compare needed -p."""
    code, out, _ = call([command, "--help"])
    assert code == 0 and "[default: 1f1b]" in " ".join(out.split())


def test_compare_help_shows_its_default_pair() -> None:
    code, out, _ = call(["compare", "--help"])
    assert code == 0 and "[default: 1f1b, atlas]" in " ".join(out.split())


def test_plan_without_a_policy_plans_the_default() -> None:
    code, out, err = call(["plan", str(TOPOLOGIES / "two-dc.yaml"), "--rows", "1"])
    assert code == 0, err
    assert "policy 1f1b:" in out


def test_counts_are_singular_for_one(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text("datacenters:\n  - {name: east, gpus: 1}\njob: {model: tiny, pp: 1}\n")
    code, out, err = call(["validate", str(path), "--iterations", "1"])
    assert code == 0, err
    assert "1 datacenter, 1 GPU, 0 WAN links" in out and "1 iteration," in out
    code, out, err = call(["plan", str(path), "--microbatches", "1", "--rows", "1"])
    assert code == 0, err
    assert "1 of 1 GPU, 1 microbatch of" in out and "(1 GPU)" in out


def test_a_simulation_names_no_shaper(tmp_path: Path) -> None:
    code, out, err = call(["simulate", str(TOPOLOGIES / "two-dc.yaml"), "--out",
                           str(tmp_path / "run")])
    assert code == 0, err
    assert "shaper" not in out and "compute modeled" in out


def _commands(group: click.Group, path: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        yield f"{path}{name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{path}{name} ")


def test_every_choice_is_its_literal_type() -> None:
    """A choice offered on the command line is the Literal its command's argument is
    typed with, in order: a new value is written once, in its type."""
    from testbed.cli.main import cli
    from testbed.run.spec import run_settings

    settings = {name: named.hint for name, named in run_settings().items()}
    checked = 0
    for name, command in _commands(cli):
        assert command.callback is not None
        hints = {**settings, **get_type_hints(inspect.unwrap(command.callback))}
        for param in command.params:
            if not isinstance(param.type, click.Choice) or param.name not in hints:
                continue
            literal = hints[param.name]
            if get_origin(literal) is not Literal:
                continue
            assert list(param.type.choices) == list(get_args(literal)), (name, param.name)
            checked += 1
    assert checked >= 10
