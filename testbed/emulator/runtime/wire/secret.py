"""The secret a run across machines proves: a file every machine holds, named in the
cluster file. It never travels: a joining process and the coordinator each answer the
other's fresh nonce with an HMAC of it, and the run's token (which authenticates data
connections) is derived from it and a nonce. Reading the file, and refusing one others
can read, is the cluster file's part (testbed.topology.secret_file)."""

from __future__ import annotations

import hashlib
import hmac
import json


def join_proof(secret: bytes, challenge: str, nonce: str, machine: str, rank: int) -> str:
    """A joining process's answer to the coordinator's fresh `challenge`, for the seat it
    asks for and its own fresh `nonce` (which the coordinator's answer must cover)."""
    return _mac(secret, "join", challenge, nonce, machine, str(rank))


def coordinator_proof(secret: bytes, challenge: str, nonce: str, machine: str, rank: int,
                      run_nonce: str) -> str:
    """The coordinator's answer to a join: the joining process's fresh `nonce` (so an old
    answer is worth nothing), what it asked for, and the run's nonce it is given."""
    return _mac(secret, "coordinator", challenge, nonce, machine, str(rank), run_nonce)


def proves(expected: str, answer: str) -> bool:
    """Whether a peer's `answer` is the proof `expected`, in constant time."""
    return hmac.compare_digest(expected.encode(), answer.encode(errors="replace"))


def _mac(secret: bytes, side: str, *parts: str) -> str:
    """An HMAC under the secret of what one side vouches for: its side's name keeps one
    side's proof from passing as the other's, JSON keeps the parts apart."""
    return hmac.new(secret, json.dumps([side, *parts]).encode(), hashlib.sha256).hexdigest()


def run_token(secret: bytes, nonce: str) -> str:
    """The run's token (64 hex digits), as the coordinator and every worker derive it."""
    return hmac.new(secret, b"run:" + nonce.encode(), hashlib.sha256).hexdigest()
