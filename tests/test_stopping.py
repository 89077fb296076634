"""A stop signal that lands while a connection is being read ends the process cleanly: no
connection is torn as a fatal transport error (uvloop's "get_buffer" failure)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import asyncio, os, signal, sys
    from testbed.emulator.runtime.worker.stopping import until_signalled
    from testbed.emulator.runtime.worker.transport.transport import Transport, _Link
    from testbed.emulator.runtime.worker.process import run_loop

    read_buffer = _Link.get_buffer
    def get_buffer(self, sizehint):
        if not getattr(_Link, "signalled", False):  # the signal lands inside the read
            _Link.signalled = True
            os.kill(os.getpid(), signal.{signame})
        return read_buffer(self, sizehint)
    _Link.get_buffer = get_buffer

    async def main():
        token = b"t" * 32
        a, b = Transport(0, token), Transport(1, token)
        port = await b.listen("127.0.0.1", 0)
        await asyncio.gather(a.connect({{1: ("127.0.0.1", port, 2)}}, {{}}),
                             b.connect({{}}, {{0: 2}}))
        await a.send(1, "x", bytes(1 << 20))
        await b.recv("x")
        await asyncio.sleep(30)  # the signal ends us long before this
        return 0

    sys.exit(run_loop(until_signalled(main())))
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_inside_a_read_ends_the_process_without_a_transport_error(
        signum: signal.Signals) -> None:
    child = subprocess.run([sys.executable, "-c", CHILD.format(signame=signum.name)],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 128 + signum, child.stderr
    assert "get_buffer" not in child.stderr and "Fatal error" not in child.stderr, child.stderr
