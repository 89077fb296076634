"""The emulator's record of its hosts' TCP connections (`ss -tin`), parsed."""

from __future__ import annotations

from testbed.emulator.net.tcp_state import SocketState, parse_ss
from testbed.emulator.runtime.coordinator.hosts import wan_sockets

# two sockets as `ss -tinH state established` prints them on this kernel: a WAN
# connection that lost packets (its threshold below its window) and a fresh one
SS = """\
0      0      10.64.0.12:51574 10.64.1.12:35597
\t cubic wscale:7,7 rto:256 rtt:53.324/8.629 ato:40 mss:1448 pmtu:1500 rcvmss:1448 \
advmss:1448 cwnd:1108 ssthresh:913 bytes_sent:1007526808 bytes_retrans:848528 \
bytes_acked:1006678281 segs_out:711462 send 240699722bps lastsnd:3988 pacing_rate \
970000000bps/970000000bps delivered:695285 busy:34376ms retrans:0/586 dsack_dups:1 \
rcv_rtt:57.487 rcv_space:3864712 rcv_ssthresh:4177920 minrtt:40 snd_wnd:4177920
0      0      [::ffff:10.64.0.12]:42534 [::ffff:10.64.0.13]:41383
\t bbr wscale:7,7 rto:204 rtt:0.022/0.013 mss:1448 cwnd:10 bytes_sent:346 \
bytes_acked:347 send 5265454545bps rcv_ssthresh:64088 minrtt:0.011 snd_wnd:65152
"""


def test_each_socket_with_its_window_threshold_and_retransmissions() -> None:
    assert parse_ss(SS) == [
        SocketState("10.64.0.12", "10.64.1.12", "cubic", 0.040, 1108, 913, 586,
                    1007526808),
        SocketState("10.64.0.12", "10.64.0.13", "bbr", 0.011e-3, 10, None, 0, 346)]


def test_the_receive_threshold_is_not_the_slow_start_one() -> None:
    only_receive = SS.splitlines()[2] + "\n" + SS.splitlines()[3] + "\n"
    (state,) = parse_ss(only_receive)
    assert state.ssthresh is None  # rcv_ssthresh:64088 is the receiver's


def test_nothing_established_is_no_socket() -> None:
    assert parse_ss("") == []
    assert parse_ss("0 0 10.0.0.1:1 10.0.0.2:2\n") == []  # no information line


def test_only_data_sent_to_another_dc_counts_as_wan() -> None:
    east, central = SS_STATES = parse_ss(SS)
    hosts = {"10.64.0.12": ("east-0", "east"), "10.64.1.12": ("central-0", "central"),
             "10.64.0.13": ("east-1", "east")}
    assert [(s.host, s.peer) for s in wan_sockets({"east-0": SS_STATES}, hosts)] \
        == [("east-0", "central-0")]
    assert wan_sockets({"east-0": [central]}, hosts) == []  # within its DC
    idle = SocketState("10.64.0.12", "10.64.1.12", "cubic", 0.04, 10, None, 0, 0)
    assert wan_sockets({"east-0": [idle]}, hosts) == []  # it sent nothing
    assert east.peer == "10.64.1.12"
