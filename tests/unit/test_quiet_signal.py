"""torchrun's SignalException traceback becomes one line (node_agent/runtime/quiet.py); every other line,
and every other traceback, passes as it was."""

from __future__ import annotations

from node_agent.runtime.quiet import QuietSignalTracebacks

SIGNALLED = b"""Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 84, in _terminate
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15
"""
CHILD_FAILED = b"""Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "x.py", line 1, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
"""


def test_a_signal_traceback_becomes_one_line_and_says_which_signal() -> None:
    quiet = QuietSignalTracebacks()
    out = quiet.feed(b"W1128 a warning\n" + SIGNALLED + b"after\n") + quiet.flush()
    assert out == b"W1128 a warning\ntorchrun stopped by a signal (Process 4242 got signal: 15); its traceback " \
                  b"is not shown\nafter\n"
    assert quiet.signalled == "Process 4242 got signal: 15" and quiet.signalled_at is not None


def test_any_other_traceback_passes_whole_even_fed_line_by_line() -> None:
    quiet = QuietSignalTracebacks()
    out = b"".join(quiet.feed(line) for line in CHILD_FAILED.splitlines(keepends=True)) + quiet.flush()
    assert out == CHILD_FAILED
    assert quiet.signalled is None


def test_a_traceback_cut_off_by_the_end_of_the_output_is_kept() -> None:
    quiet = QuietSignalTracebacks()
    head = b"".join(SIGNALLED.splitlines(keepends=True)[:3])
    assert quiet.feed(head) == b""  # held: its last line will say what it was
    assert quiet.flush() == head
