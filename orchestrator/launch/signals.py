"""The signals that end `ddpctl up` while it supervises a job: SIGINT raises KeyboardInterrupt as
always; SIGTERM and SIGHUP raise StopSignal (a KeyboardInterrupt), so that all three stop the
job on every host the same way. Handlers are set for a block and restored after it, in the main
thread only (elsewhere there is no signal to mind)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

STOP_SIGNALS = {signal.SIGTERM: "SIGTERM (e.g. `timeout`, a cancelled CI job or `kill`)",
                signal.SIGHUP: "SIGHUP (the terminal closed)"}


class StopSignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP to `up`: handled as Ctrl-C is, then `up` exits 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _handling(signums: tuple[int, ...], handler: signal.Handlers | Callable[[int, FrameType | None], None]
              ) -> Iterator[bool]:
    """`handler` for `signums` during the block, the previous handlers after it; False (and no
    change) outside the main thread, where there is no signal to mind."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield True
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


@contextlib.contextmanager
def interrupts_ignored() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP ignored for the block (main thread only)."""
    with _handling((signal.SIGINT, *STOP_SIGNALS), signal.SIG_IGN):
        yield


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise StopSignal in the main thread for the block, as SIGINT raises
    KeyboardInterrupt."""
    def raise_stop(signum: int, _frame: FrameType | None) -> None:
        raise StopSignal(signum)

    with _handling(tuple(STOP_SIGNALS), raise_stop):
        yield


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP held for the block and raised when it ends (KeyboardInterrupt,
    or StopSignal): a submission that has happened is recorded before `up` stops (main thread
    only)."""
    got: list[int] = []
    with _handling((signal.SIGINT, *STOP_SIGNALS), lambda signum, _frame: got.append(signum)):
        yield
    if got:
        raise KeyboardInterrupt() if got[0] == signal.SIGINT else StopSignal(got[0])
