"""The secret a run across machines proves: a file every machine holds, named in the
cluster file. It never travels: a joining process and the coordinator each answer the
other's fresh nonce with an HMAC of it, and the run's token (which authenticates data
connections) is derived from it and a nonce."""

from __future__ import annotations

import hashlib
import hmac
import json
import stat
from pathlib import Path

from testbed.errors import InputError
from testbed.topology.cluster import Cluster


def read_secret(cluster: Cluster) -> bytes:
    """The secret's bytes; InputError naming the cluster file's `secret` key otherwise."""
    path = cluster.secret
    if path is None:
        raise InputError("a run across machines needs `secret`: a file every machine holds "
                         "(e.g. 32 random bytes, mode 600)", cluster.source, "secret")
    try:
        return read_secret_file(path)
    except InputError as exc:
        raise exc.at(cluster.source, "secret") from None


def read_secret_file(path: Path) -> bytes:
    """The secret in `path`: readable by its owner alone and at least 16 bytes long (the
    same rule on every machine); InputError saying what is wrong otherwise."""
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InputError(f"{path} is open to other users (mode {stat.S_IMODE(mode):o}); "
                         f"chmod 600 it")
    if len(data.strip()) < 16:
        raise InputError(f"{path} holds {len(data.strip())} bytes; a secret needs at least "
                         "16")
    return data.strip()


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
