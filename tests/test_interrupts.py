"""Stop signals while a network is made: recorded inside a step, raised between steps."""

from __future__ import annotations

import os
import signal

import pytest

from testbed.emulator.net.interrupts import critical, stop_point, stop_signals
from testbed.errors import Terminated


def test_a_signal_inside_a_step_waits_for_the_next_stop_point() -> None:
    steps: list[str] = []
    with stop_signals(), pytest.raises(Terminated), critical():
        os.kill(os.getpid(), signal.SIGTERM)
        steps.append("the step went on")  # not cut short where the signal landed
        stop_point()
        steps.append("past the stop point")
    assert steps == ["the step went on"]


def test_outside_a_step_a_signal_raises_at_once_and_teardown_is_not_cut_short() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with stop_signals():
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            signal.pause()  # woken by the handler, which raises
        with critical():  # as a teardown is: a second signal only waits
            os.kill(os.getpid(), signal.SIGTERM)
    stop_point()  # what was pending when the command ended is dropped, not raised
    assert signal.getsignal(signal.SIGTERM) is before
