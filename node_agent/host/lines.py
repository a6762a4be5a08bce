"""Whole lines out of a byte stream read in chunks: what the node's output pump and the control
plane's readers both need (a chunk may end in the middle of a line). Standard library only."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Callable, Iterator


def whole_lines(read: Callable[[], bytes]) -> Iterator[bytes]:
    """Each chunk `read()` returns (b"" at the end), cut after its last newline: the rest waits
    for the next chunk; an unterminated last line comes at the end with a newline added."""
    partial = b""
    while True:
        data = read()
        if not data:
            break
        data = partial + data
        cut = data.rfind(b"\n") + 1
        partial = data[cut:]
        if cut:
            yield data[:cut]
    if partial:
        yield partial + b"\n"
