"""ICMP echo with microsecond RTTs (iputils ping prints three significant digits: `100 ms`).

Run inside a namespace: `python -m testbed.emulator.net.pinger ADDRESS --count 50 --interval 0.01`.
Prints one JSON object: the RTTs in seconds, and how many requests went unanswered. The
kernel timestamps each reply on arrival (SO_TIMESTAMPNS), so our own scheduling delay does
not inflate the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import time

ICMP_ECHO_REQUEST = 8
ICMP_ECHO_REPLY = 0
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return int(~total & 0xFFFF)


def echo_request(ident: int, seq: int, payload: bytes) -> bytes:
    header = struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, 0, ident, seq)
    body = header + payload
    return struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, checksum(body), ident, seq) + payload


def ping(address: str, count: int, interval_s: float, timeout_s: float) -> dict[str, object]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    ident = os.getpid() & 0xFFFF
    sent: dict[int, float] = {}
    rtts: list[float] = []
    next_send = time.time()
    seq = 0
    deadline = None
    while True:
        now = time.time()
        if seq < count and now >= next_send:
            sent[seq] = time.time()
            sock.sendto(echo_request(ident, seq, b"testbed-ping"), (address, 0))
            seq += 1
            next_send += interval_s
            if seq == count:
                deadline = time.time() + timeout_s
        if seq == count and (len(rtts) == count or (deadline and time.time() > deadline)):
            break
        wait = max(0.0, min(next_send - time.time(), 0.05)) if seq < count else 0.05
        if not select.select([sock], [], [], wait)[0]:
            continue
        data, ancillary, _, _ = sock.recvmsg(2048, socket.CMSG_SPACE(16))
        arrived = time.time()
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                secs, nanos = struct.unpack("qq", value[:16])
                arrived = secs + nanos / 1e9
        ihl = (data[0] & 0x0F) * 4
        kind_, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl : ihl + 8])
        if kind_ == ICMP_ECHO_REPLY and rid == ident and rseq in sent:
            rtts.append(arrived - sent.pop(rseq))
    return {"rtts": rtts, "lost": count - len(rtts)}


def main() -> None:
    parser = argparse.ArgumentParser(description="ICMP echo with microsecond RTTs")
    parser.add_argument("address")
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args()
    print(json.dumps(ping(args.address, args.count, args.interval, args.timeout)))


if __name__ == "__main__":
    main()
