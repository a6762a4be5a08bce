"""Who holds a port on this host, and freeing it safely: refusal rules, tree kill, verification.

Owners come from psutil when it is importable, else from /proc/net/{tcp,tcp6,udp,udp6} and the
socket inodes under /proc/<pid>/fd. TIME_WAIT sockets (no process) are counted, with the time
left on their timer, instead of being "killed".
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pwd
import time
from pathlib import Path

from node_agent.host.procfs import iter_stats, proc_cmdline, process_groups, read_stat
from node_agent.host.runstate import proc_job_id
from node_agent.host.sitedirs import add_site_packages
from node_agent.host.terminate import terminate
from node_agent.ops.probe import bind_error
from node_agent.wire.replies import wire
from node_agent.wire.replies_ports import KilledProcess, PortOwner, PortReport, RefusedProcess, UnseenSocket

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, Iterable, List, Optional, Set

add_site_packages()  # the agent starts without them (python -S): psutil may be there
try:
    import psutil
except ImportError:  # a host without psutil: /proc it is
    psutil = None  # type: ignore[assignment]

TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
              "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN",
              "0B": "CLOSING"}
SYSTEM_SERVICES = frozenset({"sshd", "systemd", "init", "dockerd", "containerd", "kubelet", "systemd-resolved",
                             "chronyd", "ntpd", "rpcbind", "nfsd"})
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_proc_net(text: str, port: int) -> List[Dict[str, Any]]:
    """Sockets bound to local `port` from one /proc/net/{tcp,tcp6,udp,udp6} table."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10:
            continue
        local, remote, state = parts[1], parts[2], parts[3]
        if int(local.rsplit(":", 1)[1], 16) != port:
            continue
        timer, _, when = parts[5].partition(":")
        out.append({"laddr": _addr(local), "raddr": _addr(remote), "status": TCP_STATES.get(state, state),
                    "inode": int(parts[9]), "uid": int(parts[7]),
                    "timer_s": int(when, 16) / float(CLK_TCK) if timer != "00" else 0.0})
    return out


def _addr(hexaddr: str) -> str:
    """/proc/net hex "0100007F:1F90" (host byte order per 32-bit word) -> "127.0.0.1:8080"."""
    host, port = hexaddr.rsplit(":", 1)
    raw = bytes.fromhex(host)
    packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return fmt_addr(str(ipaddress.ip_address(packed)), int(port, 16))


def fmt_addr(ip: str, port: int) -> str:
    """One spelling for both backends: "1.2.3.4:80", "[::1]:80" (scope ids dropped)."""
    with contextlib.suppress(ValueError):
        ip = str(ipaddress.ip_address(ip.split("%", 1)[0]))
    return "[%s]:%d" % (ip, port) if ":" in ip else "%s:%d" % (ip, port)


def proc_sockets(port: int, proto: str) -> List[Dict[str, Any]]:
    sockets: List[Dict[str, Any]] = []
    for table in (proto, proto + "6"):
        try:
            sockets += parse_proc_net(Path("/proc/net/" + table).read_text(), port)
        except OSError:
            continue
    return sockets


def inode_pids(inodes: Set[int]) -> Dict[int, Set[int]]:
    """socket inode -> pids holding it, by reading /proc/<pid>/fd links."""
    found: Dict[int, Set[int]] = {}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            fds = list((pid_dir / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(str(fd))
            except OSError:
                continue
            if link.startswith("socket:[") and int(link[8:-1]) in inodes:
                found.setdefault(int(link[8:-1]), set()).add(int(pid_dir.name))
    return found


def _psutil_holders(port: int, proto: str) -> Optional[List[Dict[str, Any]]]:
    """Holders from psutil, or None where psutil cannot list connections (the /proc scan is used)."""
    kind = "udp" if proto == "udp" else "tcp"
    out = []
    try:
        conns = psutil.net_connections(kind=kind)
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.laddr and c.laddr.port == port and c.pid:
            out.append({"pid": c.pid, "status": c.status if kind == "tcp" else "BOUND",
                        "laddr": fmt_addr(c.laddr.ip, c.laddr.port),
                        "raddr": fmt_addr(c.raddr.ip, c.raddr.port) if c.raddr else ""})
    return out


def _proc_holders(port: int, proto: str, sockets: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    live = [s for s in sockets if s["inode"]]
    pids = inode_pids({s["inode"] for s in live})
    return [{"pid": pid, "status": s["status"] if proto == "tcp" else "BOUND", "laddr": s["laddr"],
             "raddr": s["raddr"], "inode": s["inode"]} for s in live for pid in sorted(pids.get(s["inode"], ()))]


def _remote(raddr: str) -> str:
    """"" for no peer: psutil leaves it empty, /proc writes 0.0.0.0:0 or [::]:0."""
    return "" if not raddr or raddr.endswith("]:0") or raddr == "0.0.0.0:0" else raddr


def unseen_sockets(sockets: List[Dict[str, Any]], holders: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Sockets on the port that a process holds (non-zero inode) but no visible holder explains:
    another user's process whose /proc/<pid>/fd this agent cannot read. The port is not free."""
    inodes = {h["inode"] for h in holders if h.get("inode")}
    pairs = {(h["laddr"], _remote(h["raddr"])) for h in holders}
    out = []
    for s in sockets:
        if s["inode"] and s["inode"] not in inodes and (s["laddr"], _remote(s["raddr"])) not in pairs:
            out.append({"status": s["status"], "laddr": s["laddr"], "raddr": s["raddr"], "uid": s["uid"],
                        "user": _user(s["uid"])})
    return out


def ppid_of(pid: int) -> Optional[int]:
    stat = read_stat(pid)
    return stat.ppid if stat else None


def process_info(pid: int) -> Dict[str, Any]:
    try:
        uid = Path("/proc/%d" % pid).stat().st_uid
    except OSError:
        uid = -1
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        name = Path("/proc/%d/comm" % pid).read_text().strip()
    except OSError:
        name = "?"
    cmdline = proc_cmdline(pid)
    created = _create_time(pid)
    return {"pid": pid, "ppid": ppid_of(pid), "uid": uid, "user": user, "name": name, "cmdline": cmdline,
            "create_time": created, "age_s": round(time.time() - created, 1) if created else None,
            "ddpctl_job_id": proc_job_id(pid),
            "is_torchrun": is_torchrun(cmdline), "torchrun_agent": _torchrun_parent(pid)}


def _torchrun_parent(pid: int) -> Optional[int]:
    """The torchrun agent that started this worker, if any (the kill then takes the agent's tree)."""
    parent = ppid_of(pid)
    return parent if parent and is_torchrun(proc_cmdline(parent)) else None


def is_torchrun(cmdline: List[str]) -> bool:
    """torchrun's elastic agent: `torchrun ...`, `python [opts] /path/torchrun ...` or
    `python [opts] -m torch.distributed.run ...` (interpreter options such as -u, -X x skipped)."""
    if not cmdline:
        return False
    if os.path.basename(cmdline[0]) == "torchrun":
        return True
    i = 1
    while i < len(cmdline):
        arg = cmdline[i]
        if arg == "-m" or (arg.startswith("-m") and len(arg) > 2):
            module = arg[2:] or (cmdline[i + 1] if i + 1 < len(cmdline) else "")
            return module in ("torch.distributed.run", "torch.distributed.launch")
        if arg in ("-c", "-") or not arg.startswith("-"):
            return os.path.basename(arg) == "torchrun"
        i += 2 if arg in ("-X", "-W", "-Q") else 1
    return False


def _create_time(pid: int) -> Optional[float]:
    stat = read_stat(pid)
    if stat is None:
        return None
    try:
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime"))
    except (OSError, StopIteration, ValueError):
        return None
    return btime + stat.start_ticks / float(CLK_TCK)


def find_owners(port: int, proto: str = "tcp") -> Dict[str, Any]:
    """Every process holding local `port` (IPv4 and IPv6), plus TIME_WAIT sockets left on it."""
    sockets = proc_sockets(port, proto)
    holders = _psutil_holders(port, proto) if psutil is not None else None
    if holders is None:
        holders = _proc_holders(port, proto, sockets)
    owners: Dict[int, Dict[str, Any]] = {}
    for h in holders:
        entry = owners.get(h["pid"])
        if entry is None:
            entry = owners[h["pid"]] = dict(process_info(h["pid"]), sockets=[])
        entry["sockets"].append({"status": h["status"], "laddr": h["laddr"], "raddr": h["raddr"]})
    for entry in owners.values():
        statuses = [s["status"] for s in entry["sockets"]]
        entry["status"] = "LISTEN" if "LISTEN" in statuses else statuses[0]
        entry["laddr"], entry["raddr"] = entry["sockets"][0]["laddr"], entry["sockets"][0]["raddr"]
    time_wait = [s for s in sockets if s["status"] == "TIME_WAIT" and not s["inode"]]
    unseen = unseen_sockets(sockets, holders)
    # No holder is not yet free: a TIME_WAIT of a socket without SO_REUSEADDR still refuses the
    # bind torchrun's store makes, and so does a killed holder's socket for a moment.
    refused = bind_error(port, proto) if not owners and not unseen else None
    return {"port": port, "proto": proto, "owners": sorted(owners.values(), key=lambda o: o["pid"]),
            "unseen": unseen, "time_wait": len(time_wait),
            "time_wait_max_s": max([s["timer_s"] for s in time_wait] or [0.0]),
            "free": not owners and not unseen and refused is None, "bind_error": refused}


def ancestors(pid: int) -> Set[int]:
    chain = set()
    while pid and pid not in chain:
        chain.add(pid)
        pid = ppid_of(pid) or 0
    return chain


def refusal(owner: Dict[str, Any], my_uid: int, protected: Set[int], force: bool, only_ddpctl: bool,
            expect: Optional[Iterable[int]]) -> Optional[str]:
    """Why this owner must not be killed, or None. Pure: the rules, in one place."""
    pid = owner["pid"]
    if pid == 1:
        return "pid 1 (init) is never killed"
    if pid in protected:
        return "it is ddpctl's own session (an ancestor of the agent)"
    if expect is not None and pid not in set(expect):
        return "it was not in the list you confirmed (it appeared since)"
    if only_ddpctl and not owner.get("ddpctl_job_id"):
        return "it is not a process of a ddpctl job"
    if force:
        return None
    if owner.get("uid") != my_uid:
        return "it belongs to user %s, not you (%s); pass --force to kill it anyway" % (
            owner.get("user"), _user(my_uid))
    if owner.get("name") in SYSTEM_SERVICES:
        return "%s is a system service; pass --force to kill it anyway" % owner.get("name")
    return None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def children_map() -> Dict[int, List[int]]:
    kids: Dict[int, List[int]] = {}
    for stat in iter_stats():
        kids.setdefault(stat.ppid, []).append(stat.pid)
    return kids


def process_tree(owner: Dict[str, Any], protected: Set[int]) -> List[int]:
    """The owner and its descendants; for a torchrun worker, its torchrun agent and siblings too
    (the agent holds the TCPStore, the workers hold GPU memory)."""
    root = owner["pid"]
    parent = owner.get("torchrun_agent", _torchrun_parent(root))
    if parent and parent not in protected:
        root = parent
    kids = children_map()
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid not in tree and pid not in protected:
            tree.append(pid)
            todo += kids.get(pid, [])
    return tree


def whole_groups(pids: Iterable[int]) -> List[int]:
    """Process groups to signal as one: led by one of `pids` (never the agent's own group) and with
    every member among `pids`, so that a refused member is never signalled."""
    chosen, mine, groups = set(pids), os.getpgrp(), process_groups()
    return sorted(p for p in chosen if p != mine and p in groups and set(groups[p]) <= chosen)


def wait_free(port: int, proto: str, timeout: float, targets: Set[int], unseen_before: int = 0) -> Dict[str, Any]:
    """Poll (bounded) until no killed pid holds the port any more and, where no one else does,
    until it binds again: a killed holder's socket can outlive its last visible fd by a moment (an
    unseen socket more than the `unseen_before` there were), and a server started then (torchrun's
    store) fails with EADDRINUSE. Refused holders are not waited for."""
    deadline = time.monotonic() + timeout
    while True:
        info = find_owners(port, proto)
        held = any(o["pid"] in targets for o in info["owners"]) or len(info["unseen"]) > unseen_before
        if not (held or info["bind_error"]) or time.monotonic() >= deadline:
            return info
        time.sleep(0.1)


def unseen_reason(sock: Dict[str, Any]) -> str:
    fix = "run as root" + ("" if sock["user"] == "root" else " or as %s" % sock["user"])
    return "a %s socket %s of user %s whose process this agent (user %s) cannot see; %s" % (
        sock["status"], sock["laddr"], sock["user"], _user(os.getuid()), fix)


def mark_refusals(info: Dict[str, Any], request: Dict[str, Any]) -> Set[int]:
    """Annotate each owner with its refusal (or None); return the agent's protected pids."""
    protected = ancestors(os.getpid())
    for owner in info["owners"]:
        owner["refusal"] = refusal(owner, os.getuid(), protected, bool(request.get("force")),
                                   bool(request.get("only_ddpctl")), request.get("expect_pids"))
    return protected


def owner_reply(o: Dict[str, Any]) -> PortOwner:
    return PortOwner(pid=o["pid"], user=str(o.get("user")), cmdline=tuple(o.get("cmdline") or ()),
                     name=str(o.get("name") or ""), age_s=o.get("age_s"), status=str(o.get("status")),
                     ddpctl_job_id=o.get("ddpctl_job_id"), is_torchrun=bool(o.get("is_torchrun")),
                     refusal=o.get("refusal"), torchrun_agent=o.get("torchrun_agent"),
                     job_live=bool(o.get("job_live")))


def report(info: Dict[str, Any], **outcome: Any) -> Dict[str, Any]:
    """find_owners' look (and kill_port's outcome) as the op's reply."""
    return wire(PortReport(
        port=info["port"], proto=info["proto"], owners=tuple(owner_reply(o) for o in info["owners"]),
        time_wait=info["time_wait"], time_wait_max_s=float(info["time_wait_max_s"]), free=info["free"],
        bind_error=info["bind_error"],
        unseen=tuple(UnseenSocket(str(u["status"]), str(u["laddr"]), str(u["user"])) for u in info["unseen"]),
        **outcome))


def port_owners(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    info = find_owners(int(request["port"]), str(request.get("proto", "tcp")))
    mark_refusals(info, request)
    return report(info)


def kill_port(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """Kill the port's holders that pass the refusal rules, each with its process tree
    (SIGTERM, SIGKILL after `grace`), then re-check the port. exit_code 0: free afterwards."""
    port, proto = int(request["port"]), str(request.get("proto", "tcp"))
    grace = float(request.get("grace", 5.0))
    info = find_owners(port, proto)
    protected = mark_refusals(info, request)
    targets = [o for o in info["owners"] if o["refusal"] is None]
    refused = tuple([RefusedProcess(o["pid"], o["refusal"]) for o in info["owners"] if o["refusal"]] +
                    [RefusedProcess(None, unseen_reason(u)) for u in info["unseen"]])
    dry_run = bool(request.get("dry_run"))
    if dry_run or not targets:
        return report(info, refused=refused, dry_run=dry_run, free_after=None if dry_run else info["free"],
                      exit_code=0 if info["free"] else 1)
    everyone = tree_pids(targets, protected, bool(request.get("force")))
    done = terminate(everyone, whole_groups(everyone), grace)
    owner_pids = {o["pid"] for o in targets}
    killed = tuple(KilledProcess(p, " ".join(done.commands[p])[:300], "SIGKILL" if p in done.killed else "SIGTERM",
                                 p in owner_pids) for p in everyone if p not in done.left)
    errors = tuple("pid %s: %s" % (e.get("pid"), e.get("error")) for e in done.errors) + \
        tuple("pid %d: still alive after SIGKILL" % p for p in done.left)
    after = wait_free(port, proto, 5.0, set(everyone), len(info["unseen"]))
    now = dict(info, free=after["free"], time_wait=after["time_wait"], time_wait_max_s=after["time_wait_max_s"],
               bind_error=after["bind_error"])
    return report(now, refused=refused, killed=killed, errors=errors, free_after=after["free"],
                  after=tuple(owner_reply(o) for o in after["owners"]), exit_code=0 if after["free"] else 1)


def tree_pids(targets: List[Dict[str, Any]], protected: Set[int], force: bool) -> List[int]:
    """Every pid to signal: each target's tree, less other users' processes unless forced."""
    my_uid = os.getuid()
    pids = {p for o in targets for p in process_tree(o, protected)}
    return sorted(p for p in pids if force or p in {o["pid"] for o in targets} or _uid(p) == my_uid)


def _uid(pid: int) -> int:
    try:
        return Path("/proc/%d" % pid).stat().st_uid
    except OSError:
        return -1
