"""One command-running contract (run / start) with a local implementation; SSH lives in ssh.py.

Both implementations share one timeout rule: a command that runs past its deadline raises
`HostError(TIMEOUT)` naming the host and the command, never a made-up exit code."""

from __future__ import annotations

import contextlib
import os
import queue
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inventory import Host
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

    def close(self) -> None: ...


def timed_out(host: str, argv: Sequence[str], timeout: float | None) -> HostError:
    """The one error for a command that ran past its deadline, on any transport."""
    return HostError(host, HostErrorKind.TIMEOUT,
                     f"command did not finish within {timeout or 0:.0f}s: {shlex.join(argv)[:200]}",
                     "check the host's load, or raise the timeout")


_EOF = object()


@dataclass
class LineQueue:
    """Collects lines from reader threads into one ordered stream."""

    q: queue.Queue[object] = field(default_factory=queue.Queue)
    open_readers: int = 0

    def reader(self, name: str, stream: object) -> threading.Thread:
        self.open_readers += 1

        def pump() -> None:
            try:
                for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
                    text = raw.decode("utf-8", "replace").rstrip("\r\n")
                    self.q.put(OutputLine(name, text))
            finally:
                self.q.put(_EOF)

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        return t

    def __iter__(self) -> Iterator[OutputLine]:
        remaining = self.open_readers
        while remaining:
            item = self.q.get()
            if item is _EOF:
                remaining -= 1
            else:
                assert isinstance(item, OutputLine)
                yield item


class LocalRunning:
    """A local child process; it runs in its own session so abort() can end its group."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._lines = LineQueue()
        self._lines.reader("stdout", proc.stdout)
        self._lines.reader("stderr", proc.stderr)

    def lines(self) -> Iterator[OutputLine]:
        return iter(self._lines)

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

    def close(self) -> None:
        return None
