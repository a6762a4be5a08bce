"""Each rank's output, read from the files torchrun writes it to (`--redirects 3`), into the node's
log as whole lines with torchrun's own prefix (`[default<local rank>]:`).

torchrun's `--tee` tails the same files itself, but it passes on a line cut in two when it reads
at the moment a rank is half-way through writing it, and it stops when its own process is
stopped, losing what the ranks wrote last. Read here, a line is passed on only once whole (a piece
that waits longer than PARTIAL_S goes as it is: a progress bar without newlines still shows), and
after torchrun has ended the files are read to their end: a stopped job's last lines arrive too.
Then they are removed (`discard`): the node's output.log holds every line, once.
Standard library only, Python >= 3.8.
"""

from __future__ import annotations

import glob
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Callable, Dict, List

READ_CHUNK = 1 << 18
PARTIAL_S = 1.0  # an unfinished line waits this long for its end before it is passed on as it is
SCAN_S = 0.5  # how often new rank files are looked for
ROLE = "default"  # torchrun's worker role: its --tee prefix is "[default<local rank>]:"


class _File:
    def __init__(self, path: str, prefix: bytes) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.prefix = prefix
        self.partial = b""
        self.partial_since = 0.0
        self.done = False  # read to its very end after torchrun exited: every line handed on

    def read(self, final: bool) -> bytes:
        """Whole new lines, prefixed; with `final`, the unfinished last one too."""
        chunks = []
        while True:
            data = os.read(self.fd, READ_CHUNK)
            if not data:
                break
            chunks.append(data)
        data = self.partial + b"".join(chunks)
        if not data:
            return b""
        cut = data.rfind(b"\n") + 1
        if cut < len(data):  # an unfinished last line
            now = time.monotonic()
            if not self.partial or cut:  # it started in this read (any earlier one is whole now)
                self.partial_since = now
            if final or now - self.partial_since >= PARTIAL_S:
                data, cut = data + b"\n", len(data) + 1
        self.partial = data[cut:]
        whole = data[:cut]
        if not whole:
            return b""
        # one prefix per line, at C speed: before the first line and after every newline but the last
        return self.prefix + whole[:-1].replace(b"\n", b"\n" + self.prefix) + b"\n"

    def close(self) -> None:
        os.close(self.fd)


class RankLogs:
    """The rank files under one torchrun --log-dir, followed together."""

    def __init__(self, log_dir: str, write: Callable[[bytes], None]) -> None:
        self.log_dir = log_dir
        self.write = write
        self.files: Dict[str, _File] = {}
        self.last_scan = 0.0

    def _scan(self) -> None:
        self.last_scan = time.monotonic()
        pattern = os.path.join(glob.escape(self.log_dir), "*", "attempt_*", "*", "std*.log")
        for path in sorted(glob.glob(pattern)):
            local = os.path.basename(os.path.dirname(path))
            if path in self.files or not local.isdigit():
                continue
            try:
                self.files[path] = _File(path, ("[%s%s]:" % (ROLE, local)).encode())
            except OSError:
                continue

    def poll(self, final: bool = False) -> None:
        """Pass on what every rank file has gained (`final`: to the very end)."""
        if final or time.monotonic() - self.last_scan >= SCAN_S:
            self._scan()
        out: List[bytes] = []
        read: List[_File] = []
        for f in self.files.values():
            try:
                data = f.read(final)
            except OSError:
                continue
            read.append(f)
            if data:
                out.append(data)
        if out:
            self.write(b"".join(out))
        for f in read if final else ():
            f.done = True

    def discard(self) -> int:
        """Once the final poll has handed every line on (the node's log holds them now): remove the
        rank files read to their end, so that a host keeps a job's output once. torchrun's
        error.json beside them stays. The bytes freed."""
        freed = 0
        for f in self.files.values():
            if not f.done:
                continue
            try:
                freed += os.fstat(f.fd).st_size
                os.unlink(f.path)
            except OSError:
                continue
        return freed

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files = {}
