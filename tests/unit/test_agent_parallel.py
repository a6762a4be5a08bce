"""node_agent/host/parallel.py: the agent's thread fan-out (sub-facts, TCP dials)."""

from __future__ import annotations

import threading

from node_agent.host.parallel import run_all


def test_each_call_gives_its_result_or_its_exception_in_order() -> None:
    def boom() -> int:
        raise ValueError("no")

    outcomes = run_all([lambda: 1, boom, lambda: 3])
    assert [r for r, _ in outcomes] == [1, None, 3]
    assert outcomes[0][1] is None and outcomes[2][1] is None
    assert isinstance(outcomes[1][1], ValueError) and str(outcomes[1][1]) == "no"


def test_at_most_limit_calls_run_at_once_and_they_do_overlap() -> None:
    lock = threading.Lock()
    active = peak = 0
    barrier = threading.Barrier(2, timeout=30)  # two calls must be running together to pass it

    def call() -> None:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        barrier.wait()
        with lock:
            active -= 1

    outcomes = run_all([call] * 6, limit=2)
    assert all(exc is None for _, exc in outcomes)
    assert peak == 2


def test_inline_calls_run_in_the_callers_thread_while_the_others_run_in_theirs() -> None:
    here = threading.get_ident()
    others_started = threading.Event()

    def threaded() -> int:
        others_started.set()
        return threading.get_ident()

    def cheap() -> int:
        assert others_started.wait(30), "the inline call ran before the threads were started"
        return threading.get_ident()

    def boom() -> int:
        raise KeyError("inline")

    outcomes = run_all([threaded, cheap, boom, threaded], limit=2, inline=[1, 2])
    idents = [r for r, _ in outcomes]
    assert idents[1] == here and idents[0] != here and idents[3] != here
    assert idents[2] is None and isinstance(outcomes[2][1], KeyError)
