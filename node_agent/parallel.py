"""Run calls in threads and collect each one's result or exception, in order.

The agent's ops wait on I/O in parallel (sub-facts, TCP dials). concurrent.futures would do, but it
imports logging and traceback: ~4 ms on every host of every doctor run, for a dozen lines here.
"""

from __future__ import annotations

import functools
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

    T = TypeVar("T")
    R = TypeVar("R")
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


def map_all(fn: Callable[[T], R], items: Sequence[T], limit: int = 64) -> List[R]:
    """fn over items in parallel, results in order; the first exception (in order) is raised."""
    outcomes = run_all([functools.partial(fn, item) for item in items], limit)
    for _, exc in outcomes:
        if exc is not None:
            raise exc
    return [result for result, _ in outcomes]  # type: ignore[misc]  # (no exception: each is set)
