"""The signals that end `ddpctl up` while it supervises a job: SIGINT raises KeyboardInterrupt as
always; SIGTERM and SIGHUP raise StopSignal (a KeyboardInterrupt), so that all three stop the
job on every host the same way. Handlers are set for a block and restored after it, in the main
thread only (elsewhere there is no signal to mind)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = {signal.SIGTERM: "SIGTERM (e.g. `timeout`, a cancelled CI job or `kill`)",
                signal.SIGHUP: "SIGHUP (the terminal closed)"}


class StopSignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP to `up`: handled as Ctrl-C is, then `up` exits 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def interrupts_ignored() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP ignored for the block (main thread only; elsewhere there is no
    signal to mind)."""
    try:
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, *STOP_SIGNALS)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise StopSignal in the main thread for the block, as SIGINT raises
    KeyboardInterrupt."""
    def raise_stop(signum: int, _frame: FrameType | None) -> None:
        raise StopSignal(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, raise_stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
