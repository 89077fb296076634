"""The emulator's memory past a few GPUs: GPipe runs over thin WAN links (8 GPUs, and 16
as a benchmark), every worker's peak resident set read from /proc while it runs. Needs
root."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("clean_host")]
ROOT = Path(__file__).resolve().parent.parent
BOUND = 300 * 2**20
STOPPING = 2**20
"""What a worker may still take while it stops, after the run last read its high-water mark."""
"""The most any emulated worker may hold, however many microbatches are in flight."""


def thin_4dc(dcs: int = 4, gpus: int = 4) -> dict[str, object]:
    """`dcs` DCs (four) of `gpus` GPUs (four) on 200 Mbit/s links 10-40 ms long, every
    pair joined."""
    names = [f"dc{i}" for i in range(dcs)]
    links = [{"between": [a, b], "latency": f"{10 + 10 * ((i + j) % 4)}ms",
              "bandwidth": "200Mbit"}
             for i, a in enumerate(names) for j, b in enumerate(names) if i < j]
    return {"name": "thin-4dc",
            "datacenters": [{"name": n, "gpus": gpus, "gpu": "a100", "bandwidth": "100Gbit",
                             "latency": "50us"} for n in names],
            "wan": links,
            "job": {"model": {"layers": 8, "hidden": 512, "heads": 8, "seq_len": 256,
                              "vocab": 50257},
                    "microbatch_size": 1, "microbatches": 32, "iterations": 1, "seed": 0}}


class Sampler(threading.Thread):
    """Each worker process of one run (the children of `parent`): its peak resident set
    (VmHWM) and whether torch's libraries are mapped into it."""

    def __init__(self, parent: int) -> None:
        super().__init__(daemon=True)
        self.parent = parent
        self.peaks: dict[str, int] = {}
        self.torch: set[str] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit():
                    self._look(proc)
            time.sleep(0.2)

    def _look(self, proc: Path) -> None:
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != self.parent or b"testbed.emulator.runtime.worker.process" not in argv:
                return
            gpu = argv[argv.index(b"--gpu") + 1].decode()
            status = (proc / "status").read_text()
            maps = (proc / "maps").read_text()
        except (OSError, ValueError, IndexError):
            return
        peak = next(int(line.split()[1]) * 1024 for line in status.splitlines()
                    if line.startswith("VmHWM:"))
        self.peaks[gpu] = max(self.peaks.get(gpu, 0), peak)
        if "libtorch" in maps:
            self.torch.add(gpu)


@pytest.mark.parametrize("dcs", [2, pytest.param(4, marks=pytest.mark.benchmark)])
def test_a_gpipe_run_over_thin_links_keeps_every_worker_small(dcs: int, tmp_path: Path
                                                               ) -> None:
    """Four GPUs per DC, 32 microbatches in flight per replica."""
    topology = tmp_path / "thin-4dc.yaml"
    topology.write_text(yaml.safe_dump(thin_4dc(dcs)))
    out = tmp_path / "run"
    up = subprocess.Popen([sys.executable, "-c", "from testbed.cli.main import main; main()", "up",
                           str(topology), "-p", "gpipe",
                           "--compute", "emulated", "--out", str(out)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(up.pid)
    sampler.start()
    try:
        output, _ = up.communicate(timeout=240)
    finally:
        sampler.done.set()
        sampler.join()
    assert up.returncode == 0, output
    results = json.loads((out / "results.json").read_text())
    assert results["plan"]["dp"] * results["plan"]["pp"] == 4 * dcs
    assert results["plan"]["microbatches"] == 32
    assert len(sampler.peaks) == 4 * dcs, sampler.peaks
    assert max(sampler.peaks.values()) < BOUND, sampler.peaks
    assert not sampler.torch, f"torch is loaded in {sorted(sampler.torch)}"
    memory = results["memory"]
    # the run reports what the workers held at their peaks, read when training ended; the
    # sampler here goes on reading while they stop, which may add a little
    workers = len(sampler.peaks)
    assert memory["largest_worker_bytes"] >= max(sampler.peaks.values()) - STOPPING
    assert memory["workers_peak_bytes"] >= sum(sampler.peaks.values()) - workers * STOPPING
    assert memory["largest_worker_bytes"] < BOUND
    assert memory["workers_peak_bytes"] <= memory["predicted"]["workers_bytes"]
    assert "memory        workers" in output
