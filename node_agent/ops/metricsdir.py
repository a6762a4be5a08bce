"""The facts op's `metrics_dir` sub-fact: the host's node_exporter textfile directory (the inventory's
metrics_dir), where a running job writes its series (ddpctl-<job id>-node<rank>.prom, a temp file
renamed into place). Is it a directory this login user can write in, and does a node_exporter
process here read it (its --collector.textfile.directory, from /proc/<pid>/cmdline)?

Writing is tried for real: a file named with doctor's marker prefix (never *.prom, so node_exporter
ignores it) is created and removed, in a thread bounded by WRITE_TIMEOUT_S (a hung network mount
answers never). Only the file this op created is removed.
"""

from __future__ import annotations

import os
import threading

from node_agent.host.testfile import create_file, remove_file
from node_agent.wire.layout import DOCTOR_MARKER_PREFIX

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, List, Optional, Tuple

WRITE_TIMEOUT_S = 10.0  # the directory look's bound
EXPORTER_NAMES = ("node_exporter", "node-exporter")
TEXTFILE_FLAG = "--collector.textfile.directory"
TEXTFILE_OFF = "--no-collector.textfile"
MARKER_TEXT = b"ddpctl doctor: can the job's metrics be written here? removed at once\n"


def metrics_path(req: Dict[str, Any]) -> str:
    return os.path.expanduser(str(req.get("metrics_dir") or ""))


def fact_metrics_dir(req: Dict[str, Any]) -> Dict[str, Any]:
    """{path, user, exists, is_dir, writable (None: not tried), step and error where it could not
    write, cleanup_error, exporters: the node_exporter processes seen (None: /proc unreadable, or
    the directory did not answer), proc_error}."""
    from node_agent.host.procfs import user_name

    path = metrics_path(req)
    out: Dict[str, Any] = {"path": path, "user": user_name(os.geteuid())}
    out.update(bounded_look(path))
    if out.get("step") == "timeout":
        return out  # comparing it with node_exporter's directories would hang too
    try:
        out["exporters"] = exporters(path)
    except OSError as exc:
        out["proc_error"] = str(exc)
    return out


def look(path: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {"exists": os.path.lexists(path), "is_dir": os.path.isdir(path)}
    if out["is_dir"]:
        out.update(try_write(path))
    return out


def bounded_look(path: str) -> Dict[str, Any]:
    """look() in a thread: a directory that does not answer in WRITE_TIMEOUT_S (a hung network
    mount) is an error, not a hung doctor or launch."""
    box: Dict[str, Any] = {}
    worker = threading.Thread(target=lambda: box.update(look(path)), daemon=True)
    worker.start()
    worker.join(WRITE_TIMEOUT_S)
    if worker.is_alive():
        return {"writable": False, "step": "timeout",
                "error": "no answer from the filesystem within %gs" % WRITE_TIMEOUT_S}
    return dict(box)


def try_write(path: str) -> Dict[str, Any]:
    """Create a file in `path` and remove it, as the job's textfile writer does (its temp file)."""
    target = os.path.join(path, "%smetrics-%d-%s" % (DOCTOR_MARKER_PREFIX, os.getpid(), os.urandom(4).hex()))
    out: Dict[str, Any] = {"writable": False}
    if create_file(target, MARKER_TEXT, out):
        out["writable"] = True
        remove_file(target, out)
    return out


def textfile_dirs(argv: List[str]) -> Optional[Tuple[List[str], bool]]:
    """For a node_exporter's argv: the --collector.textfile.directory values it was given (`=X` or
    the next argument; the flag may repeat) and whether --no-collector.textfile turns the collector
    off. None: argv is not a node_exporter's (argv[0]'s base name)."""
    if not argv or not any(name in os.path.basename(argv[0]) for name in EXPORTER_NAMES):
        return None
    dirs: List[str] = []
    args = argv[1:]
    for i, arg in enumerate(args):
        if arg.startswith(TEXTFILE_FLAG + "="):
            dirs.append(arg[len(TEXTFILE_FLAG) + 1:])
        elif arg == TEXTFILE_FLAG and i + 1 < len(args):
            dirs.append(args[i + 1])
    return dirs, TEXTFILE_OFF in args


def same_dir(path: str, pid: int, named: str) -> Optional[bool]:
    """Whether `named`, a directory as process `pid` names it, is `path`: the same file seen through
    the process's root (/proc/PID/root: a container's own) or cwd. None: its root is not ours to
    read (another user's process) and the names differ."""
    if os.path.normpath(named) == os.path.normpath(path):
        return True
    base = "/proc/%d/%s" % (pid, "root" if os.path.isabs(named) else "cwd")
    try:
        theirs = os.stat(os.path.join(base, named.lstrip("/")))
    except PermissionError:
        return None
    except OSError:
        return False
    try:
        return os.path.samestat(theirs, os.stat(path))
    except OSError:
        return False


def exporters(path: str) -> List[Dict[str, Any]]:
    """Every node_exporter process /proc shows, with the textfile directories it reads and whether
    one of them is `path` (`reads`: None where that could not be told)."""
    from node_agent.host.procfs import proc_cmdline

    found: List[Dict[str, Any]] = []
    for name in sorted(os.listdir("/proc"), key=lambda n: (len(n), n)):
        if not name.isdigit():
            continue
        parsed = textfile_dirs(proc_cmdline(int(name)))
        if parsed is None:
            continue
        dirs, off = parsed
        verdicts = [same_dir(path, int(name), d) for d in dirs]
        reads = (False if off or not dirs or all(v is False for v in verdicts)
                 else True if any(verdicts) else None)
        found.append({"pid": int(name), "dirs": dirs, "disabled": off, "reads": reads})
    return found
