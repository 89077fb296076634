"""The secret a run across machines proves: a file every machine holds, named in the
cluster file. It never travels: a joining process answers a nonce with an HMAC of it, and
the run's token (which authenticates data connections) is derived from it and a nonce."""

from __future__ import annotations

import hashlib
import hmac
import stat

from testbed.errors import InputError
from testbed.topology.cluster import Cluster


def read_secret(cluster: Cluster) -> bytes:
    """The secret's bytes; InputError naming the cluster file's `secret` key otherwise."""
    path = cluster.secret
    if path is None:
        raise InputError("a run across machines needs `secret`: a file every machine holds "
                         "(e.g. 32 random bytes, mode 600)", cluster.source, "secret")
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", cluster.source,
                         "secret") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InputError(f"{path} is open to other users (mode {stat.S_IMODE(mode):o}); "
                         f"chmod 600 it", cluster.source, "secret")
    if len(data.strip()) < 16:
        raise InputError(f"{path} holds {len(data.strip())} bytes; a secret needs at least "
                         "16", cluster.source, "secret")
    return data.strip()


def proof(secret: bytes, nonce: str) -> str:
    """What a joining process answers to the coordinator's challenge `nonce`."""
    return hmac.new(secret, b"join:" + nonce.encode(), hashlib.sha256).hexdigest()


def run_token(secret: bytes, nonce: str) -> str:
    """The run's token (64 hex digits), as the coordinator and every worker derive it."""
    return hmac.new(secret, b"run:" + nonce.encode(), hashlib.sha256).hexdigest()


def proves(secret: bytes, nonce: str, answer: str) -> bool:
    return hmac.compare_digest(proof(secret, nonce).encode(), answer.encode())
