"""SimGrid's side of scripts/bench_peers.py, run by Debian's python3 (python3-simgrid):
reads a job as JSON on stdin (links: name -> [bit/s, one-way seconds]; flows: [src, dst,
bytes, start, [link, ...]]), moves every flow over its route with SimGrid's default
network model, and prints each flow's finish time and the CPU seconds of the run."""

import json
import sys
import time

import simgrid


def main() -> None:
    job = json.load(sys.stdin)
    started = time.process_time()
    engine = simgrid.Engine(["bench", "--log=root.thres:critical"])
    zone = simgrid.NetZone.create_full_zone("zone")
    hosts = {}
    for flow in job["flows"]:
        for name in flow[:2]:
            if name not in hosts:
                hosts[name] = zone.create_host(name, 1e9)
    links = {name: zone.create_link(name, [bps / 8]).set_latency(latency)
             for name, (bps, latency) in job["links"].items()}
    for link in links.values():
        link.seal()
    routed = set()
    for src, dst, _, _, route in job["flows"]:
        if (src, dst) not in routed:
            routed.add((src, dst))
            zone.add_route(hosts[src].netpoint, hosts[dst].netpoint, None, None,
                           [simgrid.LinkInRoute(links[name]) for name in route], False)
    zone.seal()
    finished = [0.0] * len(job["flows"])
    order = sorted(range(len(job["flows"])), key=lambda i: job["flows"][i][3])

    def driver() -> None:
        """One actor starts every flow at its time and notes when each ends (an actor
        per flow would be a thread per flow)."""
        pending: list[simgrid.Comm] = []
        index: list[int] = []
        for i in order:
            src, dst, nbytes, start, _ = job["flows"][i]
            wait = start - simgrid.Engine.clock
            while wait > 0 and pending:
                done = simgrid.Comm.wait_any_for(pending, wait)
                if done < 0:
                    break
                finished[index.pop(done)] = simgrid.Engine.clock
                pending.pop(done)
                wait = start - simgrid.Engine.clock
            if wait > 0:
                simgrid.this_actor.sleep_for(wait)
            pending.append(simgrid.Comm.sendto_async(hosts[src], hosts[dst], int(nbytes)))
            index.append(i)
        while pending:
            done = simgrid.Comm.wait_any(pending)
            finished[index.pop(done)] = simgrid.Engine.clock
            pending.pop(done)

    simgrid.Actor.create("driver", next(iter(hosts.values())), driver)
    setup = time.process_time() - started
    engine.run()
    print(json.dumps({"finished": finished, "cpu_s": time.process_time() - started,
                      "setup_cpu_s": setup}))


if __name__ == "__main__":
    main()
