"""Running a plugin's code: whatever it raises is a PluginError naming the plugin, what it
was doing and the file and line in the plugin where it raised; a real Ctrl-C still
stops the command.

`SystemExit` from a plugin is a plugin error like any other: a policy must not end the
command (with exit status 0 and nothing said), and so is any other BaseException it raises
(a class of its own included). `KeyboardInterrupt` is the hard case: a
Ctrl-C arriving while plugin code runs raises it inside the plugin's frames, exactly as
a plugin raising it would. Entering plugin code in the main thread under Python's
default SIGINT handler puts in its place one of ours that raises `SignalInterrupt` (a
KeyboardInterrupt) instead, so that one that came from a signal is passed on (exit 130)
and any other is the plugin's error (exit 1). Under any other SIGINT handler (the
emulator's event loop takes the signal itself) a signal raises no KeyboardInterrupt, so
one raised is the plugin's.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

from testbed.common import sigint
from testbed.errors import PluginError, TestbedError


class SignalInterrupt(KeyboardInterrupt):
    """A real SIGINT (Ctrl-C) that arrived while plugin code ran."""


class PluginCrash(PluginError):
    """Plugin code raised; `detail` is the exception and where in the plugin it was."""

    def __init__(self, what: str, detail: str) -> None:
        self.detail = detail
        super().__init__(f"{what}: {detail}" if what else detail)


class plugin_code:
    """Run the block as the plugin from `module` (its top-level package is the plugin's
    code); anything it raises, any BaseException, but a TestbedError (a policy's own
    InputError, say) or a real Ctrl-C or SIGTERM becomes a PluginCrash "`what`: KeyError:
    'x' (at FILE:LINE)", chained to the plugin's exception. A class, not a generator: a
    simulation enters it for every arbitrated transfer."""

    def __init__(self, what: str, module: str) -> None:
        self.what = what
        self.module = module

    def __enter__(self) -> None:
        _watch_sigint()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 _trace: TracebackType | None) -> None:
        if exc is None or isinstance(exc, TestbedError) or _from_signal(exc):
            return
        raise PluginCrash(self.what, describe(exc, self.module)) from exc


def describe(exc: BaseException, module: str) -> str:
    """`KeyError: 'x' (at plugin/file.py:12)`: the innermost frame in the plugin's
    package, or the file a SyntaxError is in; no place when none is the plugin's."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    place = _place(exc, module.split(".")[0])
    return f"{text} (at {place})" if place else text


def _place(exc: BaseException, package: str) -> str | None:
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{_shown(exc.filename)}:{exc.lineno}"
    found: FrameType | None = None
    line = 0
    trace: TracebackType | None = exc.__traceback__
    while trace is not None:
        name = trace.tb_frame.f_globals.get("__name__", "")
        if name == package or name.startswith(package + "."):
            found, line = trace.tb_frame, trace.tb_lineno
        trace = trace.tb_next
    return None if found is None else f"{_shown(found.f_code.co_filename)}:{line}"


def _shown(filename: str) -> str:
    """A path relative to the working directory when it is below it."""
    relative = os.path.relpath(filename)
    return filename if relative.startswith("..") else relative


def _raise_signal_interrupt(_signum: int, _frame: FrameType | None) -> None:
    sigint.note()
    raise SignalInterrupt()


_sigint_handler: Callable[[int], object] = importlib.import_module("_signal").getsignal
"""`signal.getsignal` without its conversion to an enum, which raises and catches a
ValueError for every handler that is a function (Python's default too): a simulation
enters plugin code for every arbitrated transfer."""


def _watch_sigint() -> None:
    """Have SIGINT raise SignalInterrupt where it would raise a plain KeyboardInterrupt
    (the main thread, under Python's default handler). Left in place afterwards: it acts
    as the default does, and an event loop that took SIGINT puts the default back when
    done, to be replaced again at the next plugin call."""
    if sigint.is_default(_sigint_handler(signal.SIGINT)) and \
            threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _raise_signal_interrupt)


def _from_signal(exc: BaseException) -> bool:
    """Whether an exception is, or was raised while handling, a real Ctrl-C or a SIGTERM
    turned into an exception (testbed.errors.Terminated): the command's to stop,
    never the plugin's error."""
    from testbed.errors import Terminated

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SignalInterrupt | Terminated):
            return True
        seen = seen.__context__
    return False
