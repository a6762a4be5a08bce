"""Run calls in threads and collect each one's result or exception, in order.

The facts op waits on its sub-facts in parallel (TCP dials share one selector: probe.py).
concurrent.futures would do, but it imports logging and traceback: ~4 ms on every host of every
doctor run, for a dozen lines here.
"""

from __future__ import annotations

import threading

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

    T = TypeVar("T")
    Outcome = Tuple[Optional[T], Optional[Exception]]  # (result, None) or (None, the exception)


def run_all(calls: Sequence[Callable[[], T]], limit: int = 64,
            inline: Sequence[int] = ()) -> List[Outcome[T]]:
    """Each call in its own thread, at most `limit` at once, but the calls whose indexes are in
    `inline` (cheap ones: a thread costs more than they do) run in this thread while the others
    run; returns when all have ended."""
    outcomes: List[Outcome[T]] = [(None, None)] * len(calls)
    gate = threading.BoundedSemaphore(max(1, limit))

    def one(i: int, call: Callable[[], T]) -> None:
        try:
            outcomes[i] = (call(), None)
        except Exception as exc:
            outcomes[i] = (None, exc)
        finally:
            gate.release()

    threads = []
    for i, call in enumerate(calls):
        if i in inline:
            continue
        gate.acquire()
        thread = threading.Thread(target=one, args=(i, call), daemon=True)
        thread.start()
        threads.append(thread)
    for i in inline:
        gate.acquire()
        one(i, calls[i])
    for thread in threads:
        thread.join()
    return outcomes

