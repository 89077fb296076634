"""The simulator gives the same result to the bit however its inputs were ordered: ties at
one instant run in the order they were scheduled, flows share anew once per instant in
the sorted order of their links, and nothing depends on the order of a dict or set of
names (string hashes change from process to process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DIGEST = """
import hashlib, json, random, sys
from pathlib import Path
from testbed.experiments.inputs import load_inputs
from testbed.policy import training_policy
from testbed.experiments.planning import plan_with_simulator
from testbed.sim.simulator import Simulator

topology, policy_name, shuffle = sys.argv[1], sys.argv[2], int(sys.argv[3])
inputs = load_inputs(Path(topology), sets=("iterations=2",))
policy = training_policy(policy_name)
plan = plan_with_simulator(policy, inputs.topology, inputs.job)
simulator = Simulator(inputs.topology, inputs.job, plan, policy)
if shuffle:
    workers = list(simulator.workers.items())
    random.Random(shuffle).shuffle(workers)
    simulator.workers = dict(workers)
spans = sorted(json.dumps(span, sort_keys=True) for span in simulator.run().spans)
print(hashlib.sha256("\\n".join(spans).encode()).hexdigest())
"""


def _digest(topology: str, policy: str, shuffle: int, hash_seed: int) -> str:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    done = subprocess.run([sys.executable, "-c", DIGEST, str(ROOT / "topologies" / topology),
                           policy, str(shuffle)], capture_output=True, text=True, env=env,
                          cwd=ROOT, check=True)
    return done.stdout.strip()


@pytest.mark.parametrize(("topology", "policy"), [("paper-3dc.yaml", "1f1b"),
                                                  pytest.param("paper-3dc.yaml", "atlas",
                                                               marks=pytest.mark.benchmark),
                                                  ("gpt3-4dc.yaml", "1f1b")])
def test_a_plan_simulates_the_same_whatever_the_order_and_the_hash_seed(
        topology: str, policy: str) -> None:
    assert _digest(topology, policy, 0, 0) == _digest(topology, policy, 7, 2)


def test_the_digest_sees_a_change() -> None:
    """The comparison above can fail: a different job gives a different digest."""
    assert _digest("paper-3dc.yaml", "1f1b", 0, 0) != _digest("two-dc.yaml", "1f1b", 0, 0)
