"""The coordinator's TCP control port before a connection proves the cluster's secret, and
the joining side's checks of the coordinator, without root: real sockets on loopback."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.common.codec import to_json
from testbed.emulator.runtime.wire.join_messages import Assign, Join
from testbed.emulator.runtime.wire.protocol import (
    MAX_CONTROL_BYTES,
    MAX_UNPROVEN_BYTES,
    frame,
    read_message_blocking,
)
from testbed.emulator.runtime.wire.secret import coordinator_proof, join_proof
from testbed.emulator.runtime.worker.join import JoinFailed, connect, join, seat_from

from .loopback_coordinator import ROOT, SECRET, loopback_coordinator

NO_NAMESPACE = "machine m1 has no namespace no-such-namespace-east-0 for east-0"
"""How a join on the coordinator's machine ends on loopback: seated, then no namespace."""


def _frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


def _stranger(port: int) -> tuple[socket.socket, str]:
    """A connection the coordinator has taken, and the challenge it was sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    return sock, str(read_message_blocking(sock)["nonce"])


def _until_closed(sock: socket.socket) -> bytes:
    """What the coordinator says before it ends the connection (closed or reset); fails
    if it keeps it open for 20 s."""
    sock.settimeout(20)
    said = b""
    with sock:
        try:
            while part := sock.recv(65536):
                said += part
        except ConnectionResetError:
            pass
        except TimeoutError:
            pytest.fail("the coordinator kept the connection open")
    return said


def _send(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the coordinator may hang up before all is sent
        sock.sendall(data)


GARBAGE = {
    "bad JSON": _frame(b"{not json"),
    "bad UTF-8": _frame(b'{"op": "join", "machine": "\xff\xfe"}'),
    "a UTF-16 byte-order mark": _frame(b"\xff\xfe{\x00}\x00"),
    "nesting within the bound": _frame(b"[" * 4000),
    "200k nested [": _frame(b"[" * 200_000),
    "not an object": _frame(b"[1, 2]"),
    "another message": _frame(b'{"op": "hello", "gpu": "east-0", "token": "x"}'),
    "a join of wrong types": _frame(json.dumps({
        "op": "join", "machine": "m1", "local_rank": "0", "pid": 1, "nonce": "n",
        "proof": "p"}).encode()),
    "a join whose proof is a lone surrogate": _frame(
        b'{"op": "join", "machine": "m1", "local_rank": 0, "pid": 1, "nonce": "n", '
        b'"proof": "\\ud800"}'),
    "HTTP": b"GET / HTTP/1.0\r\n\r\n",
}


def test_garbage_before_the_proof_is_dropped_without_a_traceback(
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    with loopback_coordinator() as coordinator:
        for name, data in GARBAGE.items():
            sock, _ = _stranger(coordinator.port)
            _send(sock, data)
            assert b'"op":"assign"' not in _until_closed(sock), name
        sock = connect("127.0.0.1", coordinator.port)  # and it still seats its own
        with sock, pytest.raises(JoinFailed, match=NO_NAMESPACE):
            join(sock, SECRET, "m1", 0)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "Unhandled" not in out + err
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_an_unproven_frame_longer_than_the_bound_is_refused_from_its_length() -> None:
    with loopback_coordinator(proof_timeout_s=60) as coordinator:
        # a join that holds but for its length (JSON allows the trailing spaces): no seat
        sock, challenge = _stranger(coordinator.port)
        nonce = secrets.token_hex(16)
        body = json.dumps(to_json(Join("m1", 0, 1, nonce,
                                       join_proof(SECRET, challenge, nonce, "m1", 0)))).encode()
        _send(sock, _frame(body.ljust(MAX_UNPROVEN_BYTES + 1)))
        assert b'"op":"assign"' not in _until_closed(sock)
        # 64 MiB announced, none sent: ended at once, not after the 60 s to prove itself
        sock, _ = _stranger(coordinator.port)
        _send(sock, struct.pack("!I", MAX_CONTROL_BYTES))
        _until_closed(sock)
        # the same join within the bound is seated
        sock, challenge = _stranger(coordinator.port)
        _send(sock, frame(to_json(Join("m1", 0, 1, nonce,
                                       join_proof(SECRET, challenge, nonce, "m1", 0)))))
        assert read_message_blocking(sock)["op"] == "assign"
        sock.close()


def test_beyond_the_pending_limit_a_connection_waits_unread() -> None:
    with loopback_coordinator(pending_limit=2, proof_timeout_s=60) as coordinator:
        silent = [_stranger(coordinator.port)[0] for _ in range(2)]
        waiting = socket.create_connection(("127.0.0.1", coordinator.port), timeout=20)
        with waiting:
            assert select.select([waiting], [], [], 1.0)[0] == []  # not taken: no challenge
            silent[0].close()  # a slot frees: the one waiting is taken, proves itself, sits
            with pytest.raises(JoinFailed, match=NO_NAMESPACE):
                join(waiting, SECRET, "m1", 0)
        silent[1].close()


def test_a_connection_that_does_not_prove_itself_in_time_is_dropped() -> None:
    with loopback_coordinator(pending_limit=1, proof_timeout_s=0.5) as coordinator:
        silent, _ = _stranger(coordinator.port)
        waiting = socket.create_connection(("127.0.0.1", coordinator.port), timeout=20)
        with waiting:
            assert _until_closed(silent) == b""
            assert read_message_blocking(waiting)["op"] == "challenge"  # its slot was freed


Answer = Callable[[str, dict[str, Any]], dict[str, Any]]


@contextlib.contextmanager
def _fake_coordinator(answer: Answer) -> Iterator[int]:
    """A process on a port, for one joining process: it challenges it, reads its join and
    sends `answer(challenge, join)`."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            challenge = secrets.token_hex(16)
            conn.sendall(frame({"op": "challenge", "nonce": challenge}))
            conn.sendall(frame(answer(challenge, read_message_blocking(conn))))
            with contextlib.suppress(OSError):
                conn.recv(1)  # until the joining process hangs up

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        thread.join(20)
        listener.close()


def _assign(proof: str | None, run_nonce: str = "run") -> dict[str, Any]:
    data: dict[str, Any] = to_json(Assign("central-0", "ns", "worker", "10.0.0.1",
                                          run_nonce, proof or ""))
    if proof is None:
        del data["proof"]
    return data


def _for(secret: bytes, challenge: str, nonce: str) -> str:
    return coordinator_proof(secret, challenge, nonce, "m2", 0, "run")


ANSWERS: dict[str, Answer] = {
    "no proof": lambda c, j: _assign(None),
    "a proof under another secret": lambda c, j: _assign(
        _for(b"another secret, just as long", c, j["nonce"])),
    "the joining process's own proof, sent back": lambda c, j: _assign(j["proof"]),
    # a recorded answer replayed: the challenge is the fake's to choose, the nonce is not
    "a proof of an earlier join": lambda c, j: _assign(_for(SECRET, c, "0" * 32)),
    "a proof for another run": lambda c, j: _assign(_for(SECRET, c, j["nonce"]), "another"),
}


@pytest.mark.parametrize("name", list(ANSWERS))
def test_a_coordinator_that_does_not_prove_the_secret_is_refused(name: str) -> None:
    with _fake_coordinator(ANSWERS[name]) as port:
        sock = connect("127.0.0.1", port)
        with sock, pytest.raises(JoinFailed) as refused:
            seat_from(sock, SECRET, "m2", 0)
    message = str(refused.value)
    assert message.startswith(f"the coordinator at 127.0.0.1:{port}")
    assert "proof" in message or "did not prove the cluster's secret" in message
    assert "\n" not in message


def test_a_coordinator_that_proves_the_secret_gives_the_seat() -> None:
    """The fake above, answering as the coordinator does: so each refusal is its proof's."""
    with _fake_coordinator(lambda c, j: _assign(_for(SECRET, c, j["nonce"]))) as port:
        sock = connect("127.0.0.1", port)
        with sock:
            assert seat_from(sock, SECRET, "m2", 0).host == "central-0"


@pytest.mark.parametrize(("content", "mode", "problem"), [
    (SECRET, 0o644, "is open to other users (mode 644); chmod 600 it"),
    (SECRET, 0o640, "is open to other users (mode 640); chmod 600 it"),
    (b"short", 0o600, "holds 5 bytes; a secret needs at least 16"),
])
def test_a_joining_process_refuses_a_bad_secret_file_before_it_connects(
        tmp_path: Path, content: bytes, mode: int, problem: str) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(content)
    secret.chmod(mode)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "testbed.emulator.runtime.worker.join", "--coordinator",
             f"127.0.0.1:{port}", "--secret", str(secret), "--machine", "m2"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
            env={**os.environ, "LOCAL_RANK": "0"}, check=False)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    assert result.returncode == 1
    assert result.stderr == f"testbed join (m2, rank 0): {secret} {problem}\n"
