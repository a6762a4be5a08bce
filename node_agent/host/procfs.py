"""One process as /proc shows it: its stat line (parsed here and nowhere else), argv, environment, liveness."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass, field
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Dict, Iterator, List, Optional

# Fields after the comm's closing ")" (proc(5) numbers them from 3): 0 is state, 11/12 utime/stime,
# 19 starttime, 21 rss, 49 exit_code (Linux >= 3.5: a zombie's status as waitpid reports it).
_STATE, _PPID, _PGRP, _UTIME, _STIME, _STARTTIME, _RSS, _EXIT_CODE = 0, 1, 2, 11, 12, 19, 21, 49


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat that ddpctl uses."""

    pid: int
    comm: str
    state: str  # R, S, D, Z, T, ...
    ppid: int
    pgrp: int
    start_ticks: int  # clock ticks after boot; with the pid, it names one process across pid reuse
    # a zombie's wait status (0 for a live process; None: the kernel shows none); not part of its identity
    exit_status: Optional[int] = field(default=None, compare=False)
    cpu_ticks: int = field(default=0, compare=False)  # user + system CPU time, in clock ticks
    rss_pages: int = field(default=0, compare=False)

    @property
    def killed_by(self) -> Optional[int]:
        """The signal that ended a zombie (None: alive, exited normally, or not shown)."""
        if self.state != "Z" or not self.exit_status:
            return None
        return (self.exit_status & 0x7F) or None


def parse_stat(line: str) -> ProcStat:
    """One /proc/<pid>/stat line. comm may hold spaces and parentheses, so it ends at the LAST ")"."""
    head, paren, tail = line.rpartition(")")
    pid, open_paren, comm = head.partition(" (")
    fields = tail.split()
    if not paren or not open_paren or len(fields) <= _RSS:
        raise ValueError("not a line of /proc/PID/stat: %r" % line[:120])
    return ProcStat(pid=int(pid), comm=comm, state=fields[_STATE], ppid=int(fields[_PPID]),
                    pgrp=int(fields[_PGRP]), start_ticks=int(fields[_STARTTIME]),
                    exit_status=int(fields[_EXIT_CODE]) if len(fields) > _EXIT_CODE else None,
                    cpu_ticks=int(fields[_UTIME]) + int(fields[_STIME]), rss_pages=int(fields[_RSS]))


def read_stat(pid: int) -> Optional[ProcStat]:
    """The process's stat, or None when it is gone (or its line cannot be read)."""
    try:
        raw = Path("/proc/%d/stat" % pid).read_bytes()
    except OSError:
        return None
    try:
        return parse_stat(raw.decode("utf-8", "replace"))
    except ValueError:
        return None


def iter_stats() -> Iterator[ProcStat]:
    """The stat of every process this agent can see."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None:
                yield stat


def process_groups() -> Dict[int, List[int]]:
    """pgid -> member pids."""
    groups: Dict[int, List[int]] = {}
    for stat in iter_stats():
        groups.setdefault(stat.pgrp, []).append(stat.pid)
    return groups


def proc_cmdline(pid: int) -> List[str]:
    """A process's argv (empty when it is gone, a zombie or not ours to read)."""
    try:
        raw = Path("/proc/%d/cmdline" % pid).read_bytes()
    except OSError:
        return []
    return [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]


def proc_environ(pid: int) -> Dict[str, str]:
    """A process's environment from /proc (empty when it is gone or not ours to read)."""
    try:
        raw = Path("/proc/%d/environ" % pid).read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def user_name(uid: int) -> str:
    """The login name of a uid (the number as text where the password database has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def proc_user(pid: int) -> Optional[str]:
    """The user a process runs as, or None when this host's /proc has no such process."""
    try:
        return user_name(Path("/proc/%d" % pid).stat().st_uid)
    except OSError:
        return None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = read_stat(pid)
    return stat is not None and stat.state != "Z"
