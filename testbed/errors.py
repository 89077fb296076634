"""Errors the CLI turns into one line and a fixed exit code, never a traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

EXIT_RUNTIME = 1
EXIT_INPUT = 2
MAX_PROBLEM = 400
"""Characters of a problem kept in a message: a value quoted from a hostile file (an
expanded YAML alias, megabytes of one string) must not become a megabyte error line."""


class TestbedError(Exception):
    """A failure the user can act on; `str()` is the whole message."""

    exit_code = EXIT_RUNTIME


class TestbedWarning(UserWarning):
    """Something the user should know that stops nothing: the CLI shows it as one line."""


class InputError(TestbedError):
    """Bad input: names the file, the key path and the problem."""

    exit_code = EXIT_INPUT
    """The command's exit status for it: 2."""

    def __init__(self, problem: str, source: str | None = None, key: str | None = None) -> None:
        self.problem = clip(problem)
        self.source = source
        self.key = key
        super().__init__(self._format())

    def _format(self) -> str:
        where = ": ".join(part for part in (self.source, self.key) if part)
        return f"{where}: {self.problem}" if where else self.problem

    def at(self, source: str | None = None, key: str | None = None) -> InputError:
        """The same problem, located in a file and under a key prefix."""
        joined = join_key(key, self.key) if key else self.key
        return InputError(self.problem, source or self.source, joined)


class PluginError(TestbedError):
    """A policy plugin that cannot be loaded or misbehaves."""


class NetworkError(TestbedError):
    """The emulated network cannot be built or measured."""


class PlanError(TestbedError):
    """A plan that cannot run: deadlock, unmatched transfer, bad placement."""

    exit_code = EXIT_INPUT


def join_key(*parts: str | int | None) -> str:
    """Build a key path like `wan[1].latency` from its parts."""
    out = ""
    for part in parts:
        if part is None or part == "":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif out and not part.startswith("["):
            out += "." + part
        else:
            out += part
    return out


def one_line(text: str) -> str:
    """A message as one printable line of bounded length: newlines and control characters
    escaped, so a key or value from a broken file cannot break the one-line error
    contract."""
    return printable(clip(text.strip(), 1000)).replace("\n", "\\n")


def printable(text: str) -> str:
    """`text` as a terminal shows it and does nothing else: every character a terminal
    would act on (ESC and the sequences it starts, other control characters, invisible
    and direction-changing marks) written as its escape, `\x1b`; line breaks kept. Text
    read from a file (a saved policy name, an error, a reason) passes through here, or
    through one_line, before it is printed."""
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in text)


def clip(text: str, limit: int = MAX_PROBLEM) -> str:
    """`text` cut to about `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` when one of `choices` is close to a mistyped `word`, else ``."""
    close = difflib.get_close_matches(word, [str(choice) for choice in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Terminated(Exception):
    """SIGTERM, turned into an exception so teardown runs (not a TestbedError: nothing
    went wrong, the command was asked to stop)."""

    exit_code = 143
