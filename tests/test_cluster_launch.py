"""A run across machines without root: who sits where, the commands printed, the secret,
and the join handshake's refusals (the coordinator's side on loopback)."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from testbed.errors import InputError
from testbed.runtime.cluster_launch import ClusterRun, Seat, command_line, machine_seats
from testbed.runtime.cluster_run import ClusterJoins
from testbed.runtime.cluster_secret import proof, proves, read_secret, run_token
from testbed.runtime.control_server import ControlServer
from testbed.runtime.join import JoinFailed, connect, join
from testbed.runtime.join_messages import ShareOrder
from testbed.topology import load_topology
from testbed.topology.cluster import dump_cluster, parse_cluster

from .test_cli import call

ROOT = Path(__file__).resolve().parent.parent
PAPER = load_topology(ROOT / "topologies" / "paper-3dc.yaml")
SECRET = b"0123456789abcdef0123456789abcdef"


def _cluster(**extra: Any) -> dict[str, Any]:
    return {"machines": [
        {"name": "m1", "address": "127.0.0.1", "dcs": ["east"]},
        {"name": "m2", "address": "10.251.0.2", "dcs": ["central"], "netns": "tbcl-m2"},
        {"name": "m3", "address": "10.251.0.3", "dcs": ["west"]},
    ], **extra}


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
                               "-m testbed.runtime.join --coordinator 127.0.0.1:29410")
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
    assert proves(SECRET, "n1", proof(SECRET, "n1"))
    assert not proves(SECRET, "n2", proof(SECRET, "n1"))
    assert not proves(b"another secret, just as long", "n1", proof(SECRET, "n1"))
    assert run_token(SECRET, "n1") != proof(SECRET, "n1")
    assert len(bytes.fromhex(run_token(SECRET, "n1"))) == 32  # a data connection's token


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _joining(cluster_data: dict[str, Any], attempts: list[tuple[bytes, str, int]]
             ) -> tuple[list[str], list[str]]:
    """The coordinator's side listening on loopback while `attempts` (secret, machine,
    rank) join one after another; what each attempt ended with, and the run's failures."""
    cluster = parse_cluster(cluster_data, "c.yaml", PAPER)
    run = ClusterRun(cluster, "m1", SECRET)
    seats = machine_seats(cluster, PAPER.dc_of, ["east-0", "central-0"], [])
    failures: list[str] = []
    outcomes: list[str] = []
    ready = threading.Event()
    stop: asyncio.Event | None = None

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        joins = ClusterJoins(ControlServer("token"), run, "nonce", seats,
                             lambda host: f"no-such-namespace-{host}", lambda _h: "10.0.0.1",
                             failures.append, ShareOrder("{}", "{}", [], "auto", 0),
                             lambda _m: None)
        await joins.listen()
        ready.set()
        await stop.wait()
        joins.close()

    loop = asyncio.new_event_loop()
    server = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    server.start()
    ready.wait(10)
    try:
        for secret, machine, rank in attempts:
            sock = connect("127.0.0.1", cluster.control_port)
            try:
                join(sock, secret, machine, rank)
                outcomes.append("joined")
            except JoinFailed as exc:
                outcomes.append(str(exc))
            finally:
                sock.close()
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        server.join(10)
        loop.close()
    return outcomes, failures


def test_joining_takes_the_secret_a_seat_and_a_namespace() -> None:
    data = _cluster(control_port=_free_port())
    outcomes, failures = _joining(data, [
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
