"""What a long command shows on stderr while it works, whether a person watches it on a
terminal or a log collects it: on a terminal, a bar; elsewhere (a pipe, a file, CI),
where a bar would show its label once and then nothing until the end, a plain line as
each unit starts and every EVERY_S seconds between. `--quiet` shows none of it (errors,
warnings and the results remain), `--verbose` adds each run's own lines."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

import click

from testbed.common.choices import Verbosity
from testbed.common.progress import Steps
from testbed.common.units import plural
from testbed.policy.parallel import ForkSafeThread

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar

EVERY_S = 10.0
"""Seconds between two status lines where no terminal shows a bar."""
THREAD_NAME = "testbed-progress"
_WRITING = threading.Lock()
"""Held while a line is written, and while this process forks (planning forks workers
beside the status thread): a forked copy never finds the thread halfway through a write,
its stream locked for good."""
os.register_at_fork(before=_WRITING.acquire, after_in_parent=_WRITING.release,
                    after_in_child=_WRITING.release)


def is_warning(message: str) -> bool:
    """A run's line that every verbosity shows (`warning: ...`)."""
    return message.lstrip().startswith("warning:")


def clock(seconds: float) -> str:
    """`45s`, `2m10s`, `1h02m`: elapsed time at a glance."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Reporter:
    """One command's progress on `stream` (stderr), at its `verbosity`. `every_s`: the
    seconds between status lines off a terminal (default EVERY_S)."""

    def __init__(self, command: str, verbosity: Verbosity, stream: TextIO | None = None,
                 every_s: float | None = None) -> None:
        self.command = command
        self.verbosity = verbosity
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = EVERY_S if every_s is None else every_s
        if self.every_s <= 0:
            raise ValueError(f"every_s must be positive, got {self.every_s}")
        self._bar: ProgressBar[str | None] | None = None

    @property
    def terminal(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def say(self, message: str) -> None:
        """The command's own progress (`up`'s and `simulate`'s run lines): all but
        --quiet show it; a warning shows at every verbosity."""
        if self.verbosity != "quiet" or is_warning(message):
            self._line(message)

    def detail(self, message: str) -> None:
        """A line of one of the command's runs (the emulator's, the plan search's):
        --verbose shows it, indented under the status lines; a warning always shows."""
        if self.verbosity == "verbose" or is_warning(message):
            self._line(f"  {message}")

    @contextmanager
    def counting(self, title: str, total: int, unit: str, done: int = 0) -> Iterator[Steps]:
        """`total` units of work (`done` of them already): a bar under `title` on a
        terminal; elsewhere `title`, a status line as each unit starts, every `every_s`
        seconds and at the end (from a thread that ends with the block)."""
        count = _Count(self, total, unit, done)
        if self.verbosity == "quiet":
            yield count
            return
        if self.terminal:
            with click.progressbar(length=total, label=title, file=self.stream,
                                   item_show_func=lambda name: name) as bar:
                bar.update(done)
                self._bar = bar
                try:
                    yield count
                finally:
                    self._bar = None
            return
        self._line(title)
        stop = threading.Event()
        beat = ForkSafeThread(target=self._beat, args=(count, stop), name=THREAD_NAME,
                              daemon=True)
        beat.start()
        try:
            yield count
        finally:
            stop.set()
            beat.join()
        self.status(count)

    def status(self, count: _Count) -> None:
        """The status line off a terminal; on one, the bar shows it."""
        if self.verbosity == "quiet":
            return
        with _WRITING:
            if self._bar is not None:
                self._bar.update(count.done - self._bar.pos, count.now)
                return
            count.shown = time.monotonic()
            click.echo(count.describe(), file=self.stream)

    def _beat(self, count: _Count, stop: threading.Event) -> None:
        """A status line once `every_s` has passed without one, until `stop`."""
        while not stop.wait(max(count.shown + self.every_s - time.monotonic(), 0.0)):
            if time.monotonic() - count.shown >= self.every_s:
                self.status(count)

    def _line(self, text: str) -> None:
        with _WRITING:
            if self._bar is not None:
                self.stream.write("\r\033[K")  # the bar's line, cleared: the text goes above
            click.echo(text, file=self.stream)
            if self._bar is not None:  # drawn again below it
                self.stream.write(f"\r{self._bar.format_progress_line()}")
                self.stream.flush()


class _Count:
    """How far one `counting` block has got."""

    def __init__(self, reporter: Reporter, total: int, unit: str, done: int) -> None:
        self.reporter = reporter
        self.total, self.unit, self.done = total, unit, done
        self.now: str | None = None
        self.began = self.shown = time.monotonic()

    def start(self, name: str) -> None:
        self.now = name
        self.reporter.status(self)

    def finish(self, name: str) -> None:
        self.done += 1
        if self.now == name:
            self.now = None
        if self.reporter.terminal:
            self.reporter.status(self)
        self.reporter.detail(f"{name}: done")

    def describe(self) -> str:
        """`compare: 3/8 runs done, now atlas-r2, 2m10s elapsed`."""
        now = f", now {self.now}" if self.now else ""
        return (f"{self.reporter.command}: {self.done}/{plural(self.total, self.unit)} "
                f"done{now}, {clock(time.monotonic() - self.began)} elapsed")
