"""Ending processes: SIGTERM to pids and process groups, a grace period, SIGKILL for the survivors."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from node_agent.host.procfs import alive, proc_cmdline, read_stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Callable, Dict, Iterable, List, Optional

KILL_WAIT_S = 5.0  # after SIGKILL: the kernel still has to reap
POLL_S = 0.05


@dataclass(frozen=True)
class Termination:
    """What terminate() did, pid by pid."""

    terminated: List[int]  # every pid signalled (SIGTERM, then SIGKILL if it outlived the grace)
    killed: List[int]  # the pids still alive after the grace period, sent SIGKILL
    left: List[int]  # alive even after SIGKILL and KILL_WAIT_S
    commands: Dict[int, List[str]]  # each signalled pid's argv, read before its first signal
    errors: List[Dict[str, Any]]  # {"pid", "error"}: a signal this agent was not permitted to send


def terminate(pids: Iterable[int], pgids: Iterable[int] = (), grace: float = 10.0,
              members: Optional[Callable[[], Iterable[int]]] = None,
              kill_wait: float = KILL_WAIT_S) -> Termination:
    """SIGTERM every group in `pgids` (os.killpg) and every pid in `pids` (os.kill; a pid that leads
    one of those groups gets the group's signal only); wait up to `grace` seconds; SIGKILL the
    survivors the same way; wait up to `kill_wait` seconds for them to go.

    `members` (default: `pids` as given) says which processes are still to be waited for: a caller
    that finds its processes by a property (the job id in their environment) passes that lookup, so
    one started during the grace period is waited for and SIGKILLed too."""
    targets = sorted(set(pids))
    groups = sorted(set(pgids))
    current: Callable[[], Iterable[int]] = members or (lambda: targets)
    commands = {p: proc_cmdline(p) for p in targets}
    errors: List[Dict[str, Any]] = []
    _signal(groups, targets, signal.SIGTERM, errors)
    survivors = wait_gone(current, grace)
    left: List[int] = []
    if survivors:
        for pid in survivors:
            commands.setdefault(pid, proc_cmdline(pid))
        _signal(groups, survivors, signal.SIGKILL, errors)
        left = wait_gone(current, kill_wait)
    return Termination(terminated=sorted(commands), killed=survivors, left=left, commands=commands,
                       errors=errors)


def wait_gone(members: Callable[[], Iterable[int]], timeout: float) -> List[int]:
    """Poll until none of `members()` is alive or `timeout` passes; the live ones, sorted."""
    deadline = time.monotonic() + timeout
    left = _live(members())
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = _live(members())
    return left


def _live(pids: Iterable[int]) -> List[int]:
    return sorted(p for p in set(pids) if alive(p))


def _signal(groups: List[int], pids: List[int], sig: int, errors: List[Dict[str, Any]]) -> None:
    for pgid in groups:
        _send(os.killpg, pgid, sig, errors)
    for pid in pids:
        if pid in groups and _leads_group(pid):
            continue  # its group's signal reached it: one signal, not two, to a handler like torchrun's
        _send(os.kill, pid, sig, errors)


def _leads_group(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and stat.pgrp == pid


def _send(send: Callable[[int, int], None], target: int, sig: int, errors: List[Dict[str, Any]]) -> None:
    try:
        send(target, sig)
    except ProcessLookupError:
        return
    except PermissionError as exc:
        errors.append({"pid": target, "error": "%s: %s" % (signal.Signals(sig).name, exc)})
