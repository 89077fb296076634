"""The control protocol's types: what goes on the wire comes back equal, and anything
else is refused with a reason instead of guessed at."""

from __future__ import annotations

import json

import pytest

from testbed.emulator.runtime.wire.arbitration import Grant, TransferRequest
from testbed.emulator.runtime.wire.messages import (
    CollectiveSetup,
    Config,
    Connect,
    DecodeAddress,
    Done,
    EmulatedTiming,
    Hello,
    IterationDone,
    KvDelivered,
    Message,
    Outbound,
    PeerInfo,
    Prefill,
    PrefillPart,
    WorkerError,
    decode,
    to_json,
)
from testbed.emulator.runtime.wire.protocol import ProtocolError
from testbed.job.model import ModelShape
from testbed.plan.model import OuterOptimizer

CONFIG = Config(
    index=1, gpu="west-0", dc="west", address="10.0.0.2", replica=0, stages=[1, 2],
    programs=[["1RECV_F0", "1F0"], ["1RECV_F0", "1F0", "1ALLREDUCE[delta,f0/2,int4]",
                                    "1OUTER_STEP[f0/2]"]],
    cycle=[0, 0, 1], neighbours={"0": PeerInfo(0, "east-0", "east")},
    collectives=[CollectiveSetup(1, "delta,f0/2,int4", 1024, [PeerInfo(1, "west-0", "west")],
                                 0.5)],
    arbitrated=["east>west"], iterations=3,
    compute="emulated", model=ModelShape(4, 64, 4, 32, 100), layers=[2, 2], seed=0, dp=1,
    microbatches=4, microbatch_size=1, activation_bytes=4096,
    emulated={"1": EmulatedTiming(0.01, 0.02, 0.01, 0.01),
              "2": EmulatedTiming(0.01, 0.02, 0.008, 0.012)},
    local_rank=1, decode=DecodeAddress("10.0.1.9", 7100),
    outer=OuterOptimizer(0.5, 0.8, False, 0.25))
EXAMPLES: list[Message] = [
    Hello("east-0", "secret", 42),
    Hello("east-decode", "secret", 43, role="decode"),
    IterationDone(2, 1.0, 2.0, None, [{"gpu": "east-0", "kind": "step", "start": 1.0,
                                       "end": 1.5, "iteration": 2, "stage": 0}]),
    TransferRequest("F:0:0:1:0", "east>west", "east-0", "west-0", "SEND_F", 0, 0, 0, 4096,
                    0, 1.25),
    WorkerError("boom"),
    Done(),
    KvDelivered(7, 3.5, 1 << 20),
    Connect({"2": Outbound("10.0.0.3", 40000, 4)}, {"0": 1}, {"2": 1.25e8}),
    Grant("F:0:0:1:0"),
    Prefill([PrefillPart(7, 128, 0, 64, 65536), PrefillPart(8, 64, 0, 64, 1024)], 0.01),
    CONFIG,
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.op)
def test_round_trip_through_json(message: Message) -> None:
    wire = json.loads(json.dumps(to_json(message)))
    assert wire["op"] == message.op
    assert decode(wire) == message


def test_wire_names_stay_as_they_were() -> None:
    wire = to_json(TransferRequest("t", "a>b", "a-0", "b-0", "SEND_F", 0, 0, 0, 9, 0, 0.0))
    assert wire["bytes"] == 9 and "nbytes" not in wire


@pytest.mark.parametrize(("data", "reason"), [
    ({"op": "launch"}, "got 'launch'"),
    ({"gpu": "x"}, "got 'None'"),
    ({"op": "grant"}, "missing 'tag'"),
    ({"op": "grant", "tag": 3}, "grant.tag is int"),
    ({"op": "kv", "request": True, "at": 1.0}, "kv.request is bool"),
    ({"op": "iteration", "iteration": 0, "started": 0, "ended": 1, "loss": "low",
      "spans": []}, "iteration.loss is str"),
    ({**to_json(CONFIG), "compute": "quantum"}, "config.compute is 'quantum', not one of"),
    ({**to_json(CONFIG), "model": {"layers": 4}}, "config.model: missing 'hidden'"),
    ({"op": "connect", "outbound": {"1": {"address": "x"}}, "inbound": {}, "pacing": {}},
     "missing 'port'"),
])
def test_bad_messages_are_refused_with_a_reason(data: dict[str, object], reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        decode(data)


def test_an_unexpected_message_is_refused() -> None:
    with pytest.raises(ProtocolError, match="expected hello, got 'done'"):
        decode({"op": "done"}, Hello)
