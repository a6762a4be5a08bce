"""torchrun's own output, less its SignalException tracebacks: torchrun prints one whenever it is
stopped by a signal (ours, `ddpctl down`'s, Slurm's), a dozen lines that say only that it got the
signal. The stop is told as what it was by the control plane; the traceback becomes one line.
Standard library only, Python >= 3.8."""

import time
from typing import List, Optional

TRACEBACK = b"Traceback (most recent call last):"
SIGNAL_EXCEPTION = b"SignalException"


class QuietSignalTracebacks:
    """Feed whole lines; get them back, a traceback held until its last line says what it was.
    A traceback that ends in torchrun's SignalException comes back as one short line."""

    def __init__(self) -> None:
        self.held: List[bytes] = []
        self.signalled: Optional[str] = None  # "Process 4242 got signal: 15": torchrun was stopped by a signal
        self.signalled_at: Optional[float] = None

    def feed(self, data: bytes) -> bytes:
        out: List[bytes] = []
        for line in data.splitlines(keepends=True):
            body = line.rstrip(b"\r\n")
            if not self.held:
                if body.endswith(TRACEBACK):
                    self.held.append(line)
                else:
                    out.append(line)
                continue
            self.held.append(line)
            if body.endswith(TRACEBACK) or not body.strip() or body[:1] in (b" ", b"\t") \
                    or body.startswith(b"During handling") or body.startswith(b"The above exception"):
                continue  # still inside the traceback (or a chained one)
            out.append(self._close(body))  # its last line: the exception
        return b"".join(out)

    def _close(self, last: bytes) -> bytes:
        held, self.held = self.held, []
        if SIGNAL_EXCEPTION in last:
            self.signalled = last.split(SIGNAL_EXCEPTION, 1)[1].strip(b": ").decode("utf-8", "replace")
            self.signalled_at = time.time()
            prefix = last[:len(last) - len(last.lstrip())]
            return prefix + b"torchrun stopped by a signal (" + self.signalled.encode() + \
                b"); its traceback is not shown\n"
        return b"".join(held)

    def flush(self) -> bytes:
        """What is held at the end of the output, as it was."""
        held, self.held = self.held, []
        return b"".join(held)
