"""A run across machines without root: who sits where, the commands printed, the secret,
and the join handshake's refusals (the coordinator's side on loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.emulator.runtime.wire.secret import (
    coordinator_proof,
    join_proof,
    proves,
    run_token,
)
from testbed.emulator.runtime.worker.join import JoinFailed, connect, join
from testbed.errors import InputError
from testbed.topology.cluster import dump_cluster, parse_cluster
from testbed.topology.seats import Seat, command_line, machine_seats
from testbed.topology.secret_file import read_secret

from .loopback_coordinator import PAPER, ROOT, SECRET, loopback_coordinator
from .loopback_coordinator import cluster_data as _cluster
from .test_cli import call


def test_a_cluster_dumps_to_what_parses_back() -> None:
    cluster = parse_cluster(_cluster(slot=3, mtu=9000, control_port=4000), "c.yaml", PAPER)
    again = parse_cluster(dump_cluster(cluster), "c.yaml", PAPER)
    assert again == cluster


def test_seats_put_each_process_on_its_dcs_machine_coordinator_first() -> None:
    cluster = parse_cluster(_cluster(coordinator="m3"), "c.yaml", PAPER)
    seats = machine_seats(cluster, PAPER.dc_of, ["east-0", "west-1", "east-1", "west-0"],
                          [])
    assert [m.machine.name for m in seats] == ["m3", "m1", "m2"]
    assert [s.host for s in seats[0].seats] == ["west-1", "west-0"]
    assert [s.host for s in seats[1].seats] == ["east-0", "east-1"]
    # no worker on m2: one process holds its share of the network (a path may cross it)
    assert seats[2].seats == (Seat("m2-network", "network"),)
    # the coordinator holds its own share: without workers it runs no torchrun
    alone = machine_seats(cluster, PAPER.dc_of, ["east-0"], [])
    assert [(m.machine.name, [s.role for s in m.seats]) for m in alone] == \
        [("m1", ["worker"]), ("m2", ["network"])]


def test_each_machine_gets_one_torchrun_with_the_rendezvous_at_the_first() -> None:
    cluster = parse_cluster(_cluster(), "c.yaml", PAPER)
    seats = machine_seats(cluster, lambda host: host.rsplit("-", 1)[0],
                          ["east-0", "central-0", "central-1"], ["west-decode"])
    lines = [command_line(cluster, seats, one, "testbed-1", Path("s")) for one in seats]
    assert lines[0].startswith("torchrun --nnodes 3 --nproc-per-node 1 --rdzv-backend c10d "
                               "--rdzv-endpoint 127.0.0.1:29400 --rdzv-id testbed-1 "
                               "--local-addr 127.0.0.1 --max-restarts 0 --rdzv-conf is_host=1 "
                               "-m testbed.emulator.runtime.worker.join "
                               "--coordinator 127.0.0.1:29410")
    assert lines[1].startswith("ip netns exec tbcl-m2 torchrun --nnodes 3 --nproc-per-node 2")
    assert "is_host" not in lines[1] and "--local-addr 10.251.0.2" in lines[1]
    assert lines[2].endswith("--secret s --machine m3")
    assert [s.role for s in seats[2].seats] == ["decode"]


@pytest.mark.parametrize(("content", "mode", "message"), [
    (None, 0o600, "cannot read"),
    (SECRET, 0o644, "is open to other users (mode 644); chmod 600 it"),
    (b"short", 0o600, "holds 5 bytes; a secret needs at least 16"),
])
def test_a_bad_secret_file_is_refused_naming_the_key(
        tmp_path: Path, content: bytes | None, mode: int, message: str) -> None:
    secret = tmp_path / "secret"
    if content is not None:
        secret.write_bytes(content)
        secret.chmod(mode)
    cluster = parse_cluster(_cluster(secret="secret"), str(tmp_path / "c.yaml"), PAPER)
    with pytest.raises(InputError, match="c.yaml: secret: .*" + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        read_secret(cluster)


def test_a_cluster_without_a_secret_cannot_run() -> None:
    cluster = parse_cluster(_cluster(), "c.yaml", PAPER)
    with pytest.raises(InputError, match=r"c\.yaml: secret: a run across machines needs"):
        read_secret(cluster)


def test_proofs_and_tokens_follow_from_the_secret_alone() -> None:
    mine = join_proof(SECRET, "c1", "n1", "m2", 0)
    assert proves(mine, join_proof(SECRET, "c1", "n1", "m2", 0))
    assert not proves(mine, join_proof(SECRET, "c2", "n1", "m2", 0))  # another challenge
    assert not proves(mine, join_proof(SECRET, "c1", "n1", "m2", 1))  # another seat
    assert not proves(mine, join_proof(b"another secret, just as long", "c1", "n1", "m2", 0))
    # one side's proof never passes as the other's, nor for another joiner's nonce
    theirs = coordinator_proof(SECRET, "c1", "n1", "m2", 0, "run")
    assert theirs != mine and not proves(theirs, coordinator_proof(SECRET, "c1", "n2", "m2", 0,
                                                                   "run"))
    assert not proves(mine, "\ud800")  # a peer's odd string is only a wrong answer
    assert run_token(SECRET, "n1") != mine
    assert len(bytes.fromhex(run_token(SECRET, "n1"))) == 32  # a data connection's token


def _joining(attempts: list[tuple[bytes, str, int]]) -> tuple[list[str], list[str]]:
    """The coordinator's side listening on loopback while `attempts` (secret, machine,
    rank) join one after another; what each attempt ended with, and the run's failures."""
    outcomes: list[str] = []
    with loopback_coordinator() as coordinator:
        for secret, machine, rank in attempts:
            sock = connect("127.0.0.1", coordinator.port)
            try:
                join(sock, secret, machine, rank)
                outcomes.append("joined")
            except JoinFailed as exc:
                outcomes.append(str(exc))
            finally:
                sock.close()
    return outcomes, coordinator.failures


def test_joining_takes_the_secret_a_seat_and_a_namespace() -> None:
    outcomes, failures = _joining([
        (b"not the secret but long enough", "m2", 0),
        (SECRET, "m2", 5),
        (SECRET, "m4", 0),
        (SECRET, "m2", 0),
        (SECRET, "m1", 0),
        (SECRET, "m1", 0),
    ])
    assert "wrong secret" in outcomes[0]
    assert "machine m2 has 1 processes in this run, not rank 5" in outcomes[1]
    assert "machine m4 has 0 processes" in outcomes[2]
    # m2's first process is to bring up m2's share (here from an empty order): it says
    # why it could not, and the run fails with that
    share = "machine m2: its share of the network could not be made: the run's topology"
    assert outcomes[3].startswith(share)
    # on the coordinator's machine: a seat and the clock, then no namespace for its host
    assert outcomes[4] == "machine m1 has no namespace no-such-namespace-east-0 for east-0"
    assert "already joined" in outcomes[5]
    assert failures[0].startswith(share)
    assert failures[1:] == ["east-0 on machine m1 left while joining"]


@pytest.mark.root
@pytest.mark.usefixtures("clean_host")  # `testbed up` needs root; CI runs as root
def test_up_across_machines_starts_only_on_the_coordinator(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "secret: secret\nmachines:\n"
        "  - {name: m1, address: 10.251.0.1, netns: tbcl-m1, dcs: [east]}\n"
        "  - {name: m2, address: 10.251.0.2, netns: tbcl-m2, dcs: [west]}\n")
    two_dc = str(ROOT / "topologies" / "two-dc.yaml")
    code, _out, err = call(["up", two_dc, "--cluster", str(cluster), "--machine", "m2"])
    assert code == 2 and "this is machine m2; a run starts on the coordinator, m1" in err
    code, _out, err = call(["up", two_dc, "--cluster", str(cluster), "--machine", "m1"])
    assert code == 2 and "cluster.yaml: secret: cannot read" in err, err
    assert len(err.strip().splitlines()) == 1
    (tmp_path / "secret").write_bytes(SECRET)
    (tmp_path / "secret").chmod(0o600)
    code, _out, err = call(["up", two_dc, "--cluster", str(cluster), "--machine", "m1",
                            "--out", str(tmp_path / "run"), "--checkpoint-every", "2"])
    assert code == 2 and "--cluster: checkpoints and --resume" in err, err
    assert not (tmp_path / "run").exists()
