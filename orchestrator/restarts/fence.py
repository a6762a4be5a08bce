"""Fencing: no attempt starts while an earlier one may still run on a host it lost.

A host declared lost may still run its part of the job: cut off from `up` (SSH blocked, a link
down), its ranks go on until its own node ends them, `node_after` after the last heartbeat it
heard (orchestrator/launch/faults.py). So before the next attempt, each lost host is dialled on a
fresh connection every `retry_every` s until it is reached and its part of the attempt is ended
there (confirmed: nothing of it left), or until its own bound has surely passed
(`FaultLimits.self_stopped_after`, counted from when it was dropped: no word of ours reaches it
after that). The rule is in docs/restarts.md ("Fencing")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inventory import Host
from orchestrator.errors import HostError
from orchestrator.launch.backends.base import Backend, Fenced
from orchestrator.launch.faults import RETRY_EVERY
from orchestrator.launch.result import clock

TICK = 0.2  # the wait wakes this often, to honour Ctrl-C at once


@dataclass(frozen=True)
class Suspect:
    """A host lost during an attempt, which may still run that attempt's ranks."""

    host: Host
    job_id: str  # the attempt's job id
    safe_at: float  # time.time() by which its own node has surely ended the job


@dataclass(frozen=True)
class Settled:
    """How a suspect was settled: reached and fenced, or waited out."""

    host: str
    fenced: Fenced | None  # None: never reached; its own bound passed
    at: float


class _Dial:
    """One dial of one host, in the background: a dial may take --connect-timeout, and a host
    whose bound passes meanwhile is not waited for."""

    def __init__(self, backend: Backend, suspect: Suspect, grace: float) -> None:
        self.result: Fenced | None = None  # None: not reached (yet)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(backend, suspect, grace), daemon=True)
        self.thread.start()

    def _run(self, backend: Backend, suspect: Suspect, grace: float) -> None:
        try:
            self.result = backend.fence(suspect.host, suspect.job_id, grace)
        except HostError:
            pass  # still out of reach: the next round dials again
        finally:
            self.done.set()


def fence(suspects: Sequence[Suspect], backend: Backend, grace: float, say: Callable[[str], None],
          before: str, retry_every: float = RETRY_EVERY) -> list[Settled]:
    """Settle every suspect before `before` (e.g. "attempt 1") starts; each outcome is said."""
    pending = {s.host.name: s for s in suspects}
    if not pending:
        return []
    longest = max(s.safe_at for s in suspects) - time.time()
    names = ", ".join(pending)
    say(f"fencing {names} before {before}: reaching {'it' if len(pending) == 1 else 'each'} again to end what it "
        f"still runs, or waiting up to {max(longest, 0):.0f} s for {'it' if len(pending) == 1 else 'each'} to stop "
        "its own ranks (Ctrl-C stops here)")
    settled: list[Settled] = []
    dials: dict[str, _Dial] = {}
    next_round = 0.0
    while pending:
        now = time.time()
        for name, dial in list(dials.items()):
            if dial.done.is_set():
                del dials[name]
                if isinstance(dial.result, Fenced) and dial.result.confirmed:
                    settled.append(Settled(name, dial.result, now))
                    say(_reached(dial.result, pending.pop(name)))
                elif isinstance(dial.result, Fenced):
                    say(f"{name}: pids {', '.join(map(str, dial.result.left))} of {pending[name].job_id} outlived "
                        "SIGKILL; trying again")
        for name, suspect in list(pending.items()):
            if now >= suspect.safe_at:
                pending.pop(name)
                settled.append(Settled(name, None, now))
                say(f"{name} not reached again; its own limit has passed (at {clock(suspect.safe_at)}): nothing of "
                    f"{suspect.job_id} runs there any more")
        if not pending:
            break
        if now >= next_round:
            next_round = now + retry_every
            for name, suspect in pending.items():
                if name not in dials:
                    dials[name] = _Dial(backend, suspect, grace)
        time.sleep(TICK)
    return settled


def _reached(fenced: Fenced, suspect: Suspect) -> str:
    if fenced.ended:
        return f"{fenced.host} reached again: ended {fenced.ended} process(es) of {suspect.job_id} still running there"
    return f"{fenced.host} reached again: nothing of {suspect.job_id} runs there"
