"""The planning pool's shutdown: calls started ahead and never awaited (a search that
stopped early, or a planner that failed or was interrupted) must not hang it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    from testbed.policy.parallel import forked_pool

    def work(i):
        return b"x" * 200_000  # results long enough to be mid-write when a pool stops

    for _ in range(60):
        with forked_pool(work, 2) as pool:
            waits = [pool.submit(i) for i in range(20)]
            waits[0]()
    print("closed 60 pools")
""")


def test_a_pool_left_with_calls_under_way_closes() -> None:
    """Killing the workers mid-result left the results queue's lock held for good, and
    the pool's own shutdown waited on it: a hang within a few dozen pools."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "closed 60 pools" in done.stdout


INTERRUPTED = textwrap.dedent("""
    from testbed.policy.parallel import forked_pool

    def work(i):
        return b"x" * 2_000_000  # long enough to be mid-write when the planner fails

    class Failed(Exception):
        pass

    for _ in range(60):
        try:
            with forked_pool(work, 2) as pool:
                waits = [pool.submit(i) for i in range(20)]
                waits[0]()
                raise Failed()
        except Failed:
            pass
    print("closed 60 failed pools")
""")


def test_a_pool_whose_planner_failed_closes_and_lets_the_failure_through() -> None:
    """A planner failing (or interrupted) with calls under way: the pool's terminate
    killed a worker mid-result, its lock stayed held, and terminate waited on it (a hang
    within about a dozen pools of 2 MB results); the failure still reaches the caller."""
    done = subprocess.run([sys.executable, "-c", INTERRUPTED], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "closed 60 failed pools" in done.stdout
