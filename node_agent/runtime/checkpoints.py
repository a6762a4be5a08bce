"""[restart] checkpoint_dir while a node's job runs, a watcher of the node supervisor: the newest
file's time when the job starts, each newer one as it appears (a `checkpoint` message with the
node's steps then: the time account's re-done work counts from the last one before a failure), the
last message sent (a re-attached control plane gets it again), and at the end whether the job
wrote one."""

from __future__ import annotations

import contextlib
import os

from node_agent.runtime.records import checkpoint_message
from node_agent.wire.layout import ATTEMPT_MARK

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    import threading
    from typing import Callable, List, Optional, Tuple

MAX_CHECKPOINT_FILES = 10000  # a checkpoint directory is looked through up to this many entries
CHECKPOINT_EVERY = 1.0  # how often [restart] checkpoint_dir is looked at while the job runs


def newest_mtime(directory: str) -> Optional[float]:
    """The modification time of the newest file under `directory` (None: none, or unreadable)."""
    newest = None  # type: Optional[float]
    seen = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            if name.startswith(ATTEMPT_MARK):  # ddpctl's own mark (node_agent/runtime/attempt_mark.py), not progress
                continue
            seen += 1
            if seen > MAX_CHECKPOINT_FILES:
                return newest
            with contextlib.suppress(OSError):
                mtime = os.stat(os.path.join(root, name)).st_mtime
                newest = mtime if newest is None or mtime > newest else newest
    return newest


class CheckpointWatch:
    """One job's checkpoint directory, seen from its node (made before any rank starts)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.before = newest_mtime(directory)  # the newest file's mtime at the start
        self.last = None  # type: Optional[bytes]  # the newest checkpoint's message sent

    def watch(self, stopping: threading.Event, running: Callable[[], bool], steps: Callable[[], Optional[int]],
              send: Callable[[bytes], None]) -> None:
        """Every CHECKPOINT_EVERY seconds while the job runs: a newer file is sent as a message."""
        newest = self.before
        while not stopping.wait(CHECKPOINT_EVERY) and running():
            mtime = newest_mtime(self.directory)
            if mtime is not None and (newest is None or mtime > newest):
                newest = mtime
                self.last = checkpoint_message(mtime, steps())
                send(self.last)

    def replay(self) -> List[bytes]:
        """What a re-attached control plane gets again: the newest checkpoint's message, built as it
        was sent live (one handed to a connection that was then replaced may never have arrived)."""
        return [self.last] if self.last is not None else []

    def at_end(self) -> Tuple[bool, Optional[float]]:
        """Whether a file there is newer than at the start (progress, whatever the step counts
        say), and the newest file's mtime."""
        after = newest_mtime(self.directory)
        return after is not None and (self.before is None or after > self.before), after
