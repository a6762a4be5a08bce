"""One command-running contract (run / start) with a local implementation; SSH lives in ssh.py.

Both implementations share one timeout rule: a command that runs past its deadline raises
`HostError(TIMEOUT)` naming the host and the command, never a made-up exit code."""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inventory import Host
from node_agent.host.lines import whole_lines
from orchestrator.errors import HostError, HostErrorKind


@dataclass(frozen=True)
class CommandResult:
    """What one command did on one host."""

    host: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, lines: int = 10) -> str:
        text = (self.stderr or self.stdout).rstrip("\n")
        return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class OutputLine:
    stream: str  # "stdout" or "stderr"
    text: str  # without the trailing newline


class RunningCommand(Protocol):
    """A command started with stdin kept open: stream its lines, feed or close its stdin."""

    def lines(self) -> Iterator[OutputLine]: ...
    def chunks(self) -> Iterator[Chunk]: ...
    def send(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int | None: ...
    def abort(self) -> None: ...


class Transport(Protocol):
    host: Host

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult: ...

    def start(self, argv: Sequence[str], *, stdin: bytes | None = None) -> RunningCommand: ...

    def reconnect(self) -> None:
        """Replace the connection with a fresh one (after an outage); raises HostError."""

    def close(self) -> None: ...


def timed_out(host: str, argv: Sequence[str], timeout: float | None) -> HostError:
    """The one error for a command that ran past its deadline, on any transport."""
    return HostError(host, HostErrorKind.TIMEOUT,
                     f"command did not finish within {timeout or 0:.0f}s: {shlex.join(argv)[:200]}",
                     "check the host's load, or raise the timeout")


_EOF = object()
CHUNK = 1 << 16  # bytes read at once from a command's stdout or stderr
QUEUED_CHUNKS = 16  # chunks a reader may hold before it waits for its consumer: memory stays bounded,
# and a consumer that falls behind leaves the backlog with the command (where a node keeps its log)

Chunk = tuple[str, str]  # (stream name, whole lines as one text, each with its newline)


@dataclass
class LineQueue:
    """Collects whole lines from reader threads into one ordered stream, a chunk at a time: each
    reader reads what is there (up to CHUNK bytes), splits it into lines once and queues them as
    one item. The queue is bounded, so a slow consumer slows the readers, not our memory."""

    q: queue.Queue[object] = field(default_factory=lambda: queue.Queue(QUEUED_CHUNKS))
    open_readers: int = 0

    def reader(self, name: str, read: Callable[[], bytes]) -> threading.Thread:
        """`read()` returns what is available (b"" at EOF)."""
        self.open_readers += 1

        def read_or_end() -> bytes:
            try:
                return read()
            except (OSError, EOFError, ValueError):  # a closed channel or pipe: its end
                return b""

        def pump() -> None:
            try:
                for data in whole_lines(read_or_end):
                    self.q.put((name, data.decode("utf-8", "replace")))
            finally:
                self.q.put(_EOF)

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        return t

    def chunks(self) -> Iterator[Chunk]:
        remaining = self.open_readers
        while remaining:
            item = self.q.get()
            if item is _EOF:
                remaining -= 1
            else:
                yield item  # type: ignore[misc]

    def __iter__(self) -> Iterator[OutputLine]:
        for name, text in self.chunks():
            for line in split_text(text):
                yield OutputLine(name, line)


def split_text(text: str) -> list[str]:
    """Whole lines (`text` ends with a newline), one split; a CR is dropped as a line's ending."""
    lines = text.split("\n")
    lines.pop()
    if "\r" in text:
        lines = [line.rstrip("\r") for line in lines]
    return lines


class LocalRunning:
    """A local child process; it runs in its own session so abort() can end its group."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._lines = LineQueue()
        assert proc.stdout is not None and proc.stderr is not None
        self._lines.reader("stdout", functools.partial(os.read, proc.stdout.fileno(), CHUNK))
        self._lines.reader("stderr", functools.partial(os.read, proc.stderr.fileno(), CHUNK))

    def lines(self) -> Iterator[OutputLine]:
        return iter(self._lines)

    def chunks(self) -> Iterator[Chunk]:
        return self._lines.chunks()

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def abort(self) -> None:
        """Drop the connection: like a lost SSH channel, the child sees stdin EOF."""
        self.close_stdin()


class LocalTransport:
    """Runs argv on this machine without SSH (localhost inventory entries)."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        started = time.monotonic()
        try:
            proc = subprocess.run(
                list(argv), input=stdin if stdin is not None else b"",
                capture_output=True, timeout=timeout, check=False,
            )
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired:
            raise timed_out(self.host.name, argv, timeout) from None
        except FileNotFoundError as exc:
            code, out, err = 127, b"", str(exc).encode()
        return CommandResult(
            host=self.host.name, argv=tuple(argv), exit_code=code,
            stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
            duration_s=time.monotonic() - started,
        )

    def start(self, argv: Sequence[str], *, stdin: bytes | None = None) -> RunningCommand:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, env=os.environ.copy(),
        )
        running = LocalRunning(proc)
        if stdin:
            running.send(stdin)
        return running

    def reconnect(self) -> None:
        return None  # no connection to lose

    def close(self) -> None:
        return None
