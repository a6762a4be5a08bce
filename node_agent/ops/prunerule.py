"""Which run directories go: the one rule the hosts (node_agent/ops/prune.py) and this machine's runs/
(orchestrator/hostops/prune.py) share, and the removal itself. Standard library only, Python >= 3.8."""

from __future__ import annotations

import errno
import os
import shutil

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, Iterable, List, Optional


class RunDir(object):
    """One directory under runs/: its run (the run id its nodes name, else its own name), when it
    was last written, and whether a process of it may still run."""

    def __init__(self, name: str, run: str, newest: float, running: bool) -> None:
        self.name = name
        self.run = run
        self.newest = newest
        self.running = running

    def __repr__(self) -> str:
        return "RunDir(%r, %r, %r, %r)" % (self.name, self.run, self.newest, self.running)


def doomed(dirs: Iterable[RunDir], keep: int, protect: Iterable[str] = ()) -> List[RunDir]:
    """The directories to remove: those of every run but the newest `keep` (a run's age is its
    newest directory's), never one of a run that may still run or that `protect` names (by run id
    or by a directory's name). Oldest first. Pure."""
    kept = set(protect)
    runs: Dict[str, List[RunDir]] = {}
    for d in dirs:
        runs.setdefault(d.run, []).append(d)
    order = sorted(runs.values(), key=lambda ds: max(d.newest for d in ds), reverse=True)
    out: List[RunDir] = []
    for group in order[max(keep, 0):]:
        if any(d.running or d.name in kept or d.run in kept for d in group):
            continue
        out.extend(group)
    return sorted(out, key=lambda d: d.newest)


def newest_entry(path: str) -> float:
    """The modification time of a run directory's newest entry, two levels down (node<k>/ and its
    files: output.log grows while the job runs)."""
    newest = _mtime(path)
    for node in entries(path):
        newest = max(newest, _mtime(node))
        for entry in entries(node):
            newest = max(newest, _mtime(entry))
    return newest


def _mtime(path: str) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def entries(path: str) -> List[str]:
    try:
        return [os.path.join(path, n) for n in os.listdir(path)]
    except OSError:
        return []


def size_of(path: str) -> int:
    """Bytes under `path`, links not followed."""
    total = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def remove(path: str) -> Optional[str]:
    """rmtree without following links; one already gone (a host sharing the home removed it
    first) is no error. The error's text, else None."""
    problems: List[str] = []

    def onerror(func: Any, target: str, info: Any) -> None:
        exc = info[1]
        if not (isinstance(exc, OSError) and exc.errno == errno.ENOENT):
            problems.append("%s: %s" % (target, exc))

    shutil.rmtree(path, onerror=onerror)
    return problems[0] if problems else None


def process_started(pid: int) -> Optional[float]:
    """When a live process started (epoch seconds, from /proc); None where it is gone (or a
    zombie) or unknown."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rpartition(")")[2].split()
        if fields[0] == "Z":
            return None
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + int(fields[19]) / float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
