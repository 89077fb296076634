"""ns-3's side of scripts/bench_peers.py (the `ns3` package from PyPI, 3.44): the same
transfers, packet by packet. Sources each reach a router over an access link of their
own delay; the router reaches the receiver's over the bottleneck (its rate, delay,
drop-tail queue and random loss, both ways). Built in C++ through ns-3's cppyy bindings
(one function, compiled once per process)."""

from __future__ import annotations

from typing import Any

CODE = r"""
#include "ns3/applications-module.h"
#include "ns3/core-module.h"
#include "ns3/internet-module.h"
#include "ns3/network-module.h"
#include "ns3/point-to-point-module.h"
#include "ns3/traffic-control-module.h"
using namespace ns3;

struct PeerWatch {
  std::vector<Ptr<PacketSink>> sinks;
  std::vector<uint64_t> want;
  std::vector<double> done;
  std::vector<uint64_t> at_from;
  void Poll() {
    bool all = true;
    for (size_t i = 0; i < sinks.size(); ++i) {
      if (done[i] < 0 && want[i] > 0 && sinks[i]->GetTotalRx() >= want[i])
        done[i] = Simulator::Now().GetSeconds();
      if (done[i] < 0) all = false;
    }
    if (!all) Simulator::Schedule(MicroSeconds(200), &PeerWatch::Poll, this);
  }
  void Mark() {
    for (size_t i = 0; i < sinks.size(); ++i) at_from[i] = sinks[i]->GetTotalRx();
  }
};

std::vector<double> peer_run(std::vector<double> access_s, std::vector<int> connections,
                             std::vector<double> bytes, double rate_bps, double delay_s,
                             int queue_bytes, double loss, std::string cc, int sndbuf,
                             int rcvbuf, double pace_bps, double from_s, double to_s) {
  Config::SetDefault("ns3::TcpL4Protocol::SocketType", StringValue("ns3::" + cc));
  Config::SetDefault("ns3::TcpSocket::SegmentSize", UintegerValue(1448));
  Config::SetDefault("ns3::TcpSocket::InitialCwnd", UintegerValue(10));
  Config::SetDefault("ns3::TcpSocket::SndBufSize", UintegerValue(sndbuf));
  Config::SetDefault("ns3::TcpSocket::RcvBufSize", UintegerValue(rcvbuf));
  Config::SetDefault("ns3::TcpSocketBase::Sack", BooleanValue(true));
  if (pace_bps > 0) {
    Config::SetDefault("ns3::TcpSocketState::EnablePacing", BooleanValue(true));
    Config::SetDefault("ns3::TcpSocketState::MaxPacingRate",
                       DataRateValue(DataRate(uint64_t(pace_bps))));
  }
  size_t n = access_s.size();
  NodeContainer sources, routers, sink;
  sources.Create(n);
  routers.Create(2);
  sink.Create(1);
  InternetStackHelper stack;
  stack.InstallAll();
  PointToPointHelper access;
  access.SetDeviceAttribute("DataRate", StringValue("10Gbps"));
  Ipv4AddressHelper addresses;
  for (size_t i = 0; i < n; ++i) {
    access.SetChannelAttribute("Delay", TimeValue(Seconds(access_s[i])));
    NetDeviceContainer d = access.Install(sources.Get(i), routers.Get(0));
    std::ostringstream net;
    net << "10." << (1 + i / 250) << "." << (i % 250) << ".0";
    addresses.SetBase(net.str().c_str(), "255.255.255.0");
    addresses.Assign(d);
  }
  PointToPointHelper neck;
  neck.SetDeviceAttribute("DataRate", DataRateValue(DataRate(uint64_t(rate_bps))));
  neck.SetChannelAttribute("Delay", TimeValue(Seconds(delay_s)));
  neck.SetQueue("ns3::DropTailQueue", "MaxSize",
                QueueSizeValue(QueueSize(QueueSizeUnit::BYTES, queue_bytes)));
  NetDeviceContainer nd = neck.Install(routers.Get(0), routers.Get(1));
  addresses.SetBase("10.200.0.0", "255.255.255.0");
  addresses.Assign(nd);
  if (loss > 0) {
    for (int side = 0; side < 2; ++side) {
      Ptr<RateErrorModel> em = CreateObject<RateErrorModel>();
      em->SetAttribute("ErrorRate", DoubleValue(loss));
      em->SetAttribute("ErrorUnit", StringValue("ERROR_UNIT_PACKET"));
      nd.Get(side)->SetAttribute("ReceiveErrorModel", PointerValue(em));
    }
  }
  access.SetChannelAttribute("Delay", TimeValue(MicroSeconds(1)));
  NetDeviceContainer ds = access.Install(routers.Get(1), sink.Get(0));
  addresses.SetBase("10.201.0.0", "255.255.255.0");
  Ipv4InterfaceContainer si = addresses.Assign(ds);
  Ipv4GlobalRoutingHelper::PopulateRoutingTables();
  PeerWatch* watch = new PeerWatch();
  uint16_t port = 5000;
  for (size_t i = 0; i < n; ++i) {
    for (int c = 0; c < connections[i]; ++c, ++port) {
      PacketSinkHelper sh("ns3::TcpSocketFactory", InetSocketAddress(Ipv4Address::GetAny(), port));
      ApplicationContainer sa = sh.Install(sink.Get(0));
      sa.Start(Seconds(0.0));
      BulkSendHelper bh("ns3::TcpSocketFactory", InetSocketAddress(si.GetAddress(1), port));
      uint64_t each = bytes[i] > 0 ? uint64_t(bytes[i] / connections[i]) : 0;
      bh.SetAttribute("MaxBytes", UintegerValue(each));
      ApplicationContainer ba = bh.Install(sources.Get(i));
      ba.Start(Seconds(0.001));
      watch->sinks.push_back(DynamicCast<PacketSink>(sa.Get(0)));
      watch->want.push_back(each);
      watch->done.push_back(each > 0 ? -1.0 : 0.0);
      watch->at_from.push_back(0);
    }
  }
  std::vector<double> out;
  if (to_s > 0) {
    Simulator::Schedule(Seconds(from_s), &PeerWatch::Mark, watch);
    Simulator::Stop(Seconds(to_s));
    Simulator::Run();
    size_t k = 0;
    for (size_t i = 0; i < n; ++i) {
      double got = 0;
      for (int c = 0; c < connections[i]; ++c, ++k)
        got += double(watch->sinks[k]->GetTotalRx() - watch->at_from[k]);
      out.push_back(got * 8 / (to_s - from_s));
    }
  } else {
    Simulator::Schedule(MicroSeconds(200), &PeerWatch::Poll, watch);
    Simulator::Stop(Seconds(600));
    Simulator::Run();
    size_t k = 0;
    for (size_t i = 0; i < n; ++i) {
      double last = 0;
      for (int c = 0; c < connections[i]; ++c, ++k) last = std::max(last, watch->done[k]);
      out.push_back(last - 0.001);
    }
  }
  Simulator::Destroy();
  delete watch;
  return out;
}
"""

_READY: list[Any] = []


def _run() -> Any:
    if not _READY:
        from ns import ns

        ns.cppyy.cppdef(CODE)
        _READY.append(ns.cppyy.gbl.peer_run)
    return _READY[0]


CC_NAMES = {"cubic": "TcpCubic", "bbr": "TcpBbr", "reno": "TcpLinuxReno"}


def run(access_s: list[float], connections: list[int], nbytes: list[float], rate_bps: float,
        delay_s: float, queue_bytes: int, loss: float, congestion: str, sndbuf: int,
        rcvbuf: int, pace_bps: float, from_s: float = 0.0, to_s: float = 0.0) -> list[float]:
    """Per source: bit/s received between `from_s` and `to_s` (when `to_s` is given and
    the sources send without end), else seconds until its last byte arrived."""
    import cppyy

    fn = _run()
    vd, vi = cppyy.gbl.std.vector["double"], cppyy.gbl.std.vector["int"]
    out = fn(vd(access_s), vi(connections), vd(nbytes), rate_bps, delay_s, queue_bytes, loss,
             CC_NAMES[congestion], sndbuf, rcvbuf, pace_bps, from_s, to_s)
    return [float(x) for x in out]


def available() -> str | None:
    """ns-3's version where its Python package is installed."""
    try:
        from importlib.metadata import version

        return version("ns3")
    except Exception:
        return None
