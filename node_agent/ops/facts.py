"""The "facts" op: what doctor checks and what a launch needs about one host, in one round trip.

Each sub-fact is a command plus a pure parser (node_agent/host/factparse.py); one that fails records
an error string under result["errors"][name] and never stops the others. request["select"] names
the sub-facts to run (the launch asks for a few); without it, doctor's whole set runs.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time

from node_agent.host import factparse
from node_agent.host.parallel import run_all
from node_agent.host.testfile import create_file, remove_file
from node_agent.ops.torch_facts import fact_ddpctl_lookup, fact_torch, fact_torch_lookup
from node_agent.wire.layout import DOCTOR_MARKER_PREFIX
from node_agent.wire.protocol import emit_event

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple

# Doctor runs this op on every host at once, so each import costs (hosts x its time): modules that
# only some sub-facts need (psutil through ports, hashlib, pathlib, dataclasses) are imported
# inside those sub-facts.

CMD_TIMEOUT_S = 10.0
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # one entry per GPU the driver knows


def run(argv: List[str], timeout: float = CMD_TIMEOUT_S) -> str:
    """stdout of argv; raises with the command's own error text when it fails."""
    if shutil.which(argv[0]) is None:
        raise FileNotFoundError("%s: command not found" % argv[0])
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (" ".join(argv), proc.returncode,
                                                 (proc.stderr or proc.stdout).strip()[-300:]))
    return proc.stdout


def fact_python(req: Dict[str, Any]) -> Dict[str, Any]:
    wanted = str(req.get("python") or "python3")
    found = shutil.which(wanted)
    return {"requested": wanted, "found": found, "agent_executable": sys.executable,
            "agent_version": sys.version.split()[0], "path_env": os.environ.get("PATH", "")}


def fact_cpu_count(req: Dict[str, Any]) -> int:
    """CPUs this process may run on (its affinity mask: a cgroup or taskset limit counts)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def fact_gpu_count(req: Dict[str, Any]) -> int:
    """NVIDIA GPUs the driver knows (0 where there is no driver or nvidia-smi fails)."""
    if os.path.isdir(NVIDIA_GPUS):
        return len(os.listdir(NVIDIA_GPUS))
    try:
        return factparse.count_nvidia_list(run(["nvidia-smi", "-L"], timeout=15.0))
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return 0


def fact_free_port(req: Dict[str, Any]) -> int:
    """A TCP port free right now (the kernel's pick for port 0), for master_port = "auto"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def fact_gpus(req: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    if shutil.which("nvidia-smi") is None:
        return None
    from node_agent.host.procfs import user_name

    gpus = factparse.parse_nvidia_gpus(run(["nvidia-smi", "--query-gpu=index,uuid,name,"
                                            "memory.total,memory.used",
                                            "--format=csv,noheader,nounits"]))
    apps = factparse.parse_nvidia_apps(run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,"
                                            "process_name,used_memory",
                                            "--format=csv,noheader,nounits"]))
    for app in apps:
        app.update(gpu_app_owner(int(app["pid"])))
    return {"gpus": gpus, "apps": apps, "user": user_name(os.getuid())}


def gpu_app_owner(pid: int) -> Dict[str, Any]:
    """Whose a GPU process is: its user and ddpctl job id, each None where this host's /proc does
    not show it (a pid of another container's namespace; another user's environment)."""
    from node_agent.host.procfs import proc_user
    from node_agent.host.runstate import proc_job_id

    return {"user": proc_user(pid), "ddpctl_job_id": proc_job_id(pid)}


def _sys_class_net() -> List[Dict[str, Any]]:
    out = []
    for name in sorted(os.listdir("/sys/class/net")):
        try:
            with open(os.path.join("/sys/class/net", name, "operstate")) as f:
                state = f.read().strip()
        except OSError:
            state = ""
        out.append({"name": name, "up": state in ("up", "unknown"), "operstate": state,
                    "loopback": name == "lo", "addresses": []})
    return out


def fact_interfaces(req: Dict[str, Any]) -> List[Dict[str, Any]]:
    if "_interfaces" in req:  # read before listening (see gather): the same answer, once
        return list(req["_interfaces"])
    try:
        return factparse.parse_ip_addr(run(["ip", "-j", "addr"]))
    except (OSError, RuntimeError, ValueError):
        return _sys_class_net()


def fact_routes(req: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The IPv4 main routing table: the control plane finds each host's route to the master (and
    the master's address toward its peers) from it, without asking the host again."""
    if "_routes" in req:
        return list(req["_routes"])
    with open("/proc/net/route") as f:  # the kernel's table, read without starting `ip`
        return factparse.parse_proc_net_route(f.read())


def net_facts(req: Dict[str, Any]) -> Dict[str, Any]:
    """Interfaces and routes, as the `listening` event carries them (a table that cannot be read
    is an empty list: the control plane then falls back to the names it has)."""
    try:
        routes = fact_routes(req)
    except (OSError, RuntimeError, ValueError):
        routes = []
    return {"interfaces": fact_interfaces(req), "routes": routes}


def fact_resolve(name: str) -> List[Dict[str, str]]:
    seen: List[Dict[str, str]] = []
    # An ASCII name goes as bytes: a str would load the idna codec (~4 ms) for nothing.
    host = name.encode() if name.isascii() else name
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP):
        entry = {"family": "inet6" if family == socket.AF_INET6 else "inet",
                 "address": str(sockaddr[0])}
        if entry not in seen:
            seen.append(entry)
    return seen


def routes_to(addresses: List[Dict[str, str]]) -> Dict[str, Any]:
    """`ip route get` for the first address of each family the master name resolves to."""
    out: Dict[str, Any] = {}
    for family in ("inet", "inet6"):
        first = next((a["address"] for a in addresses if a["family"] == family), None)
        if first is None:
            continue
        try:
            out[first] = factparse.parse_route_get(run(["ip", "-j", "route", "get", first]))
        except (OSError, RuntimeError, ValueError) as exc:
            out[first] = {"error": str(exc)}
    return out


def fact_firewall(req: Dict[str, Any]) -> Dict[str, Any]:
    port = int(req.get("master_port") or 29500)
    out: Dict[str, Any] = {}
    probes: Dict[str, Callable[[], Any]] = {
        "iptables": lambda: factparse.parse_iptables_input(run(["iptables", "-S", "INPUT"]), port),
        "nft": lambda: factparse.parse_nft_ruleset(run(["nft", "list", "ruleset"]), port),
        "ufw": lambda: factparse.parse_ufw_status(run(["ufw", "status", "verbose"])),
    }
    for name, probe in probes.items():
        try:
            out[name] = probe()
        except FileNotFoundError:
            out[name] = None  # the tool is not installed: nothing to report
        except Exception as exc:
            out[name] = {"error": str(exc)}
    return out


def fact_master_port(req: Dict[str, Any]) -> Dict[str, Any]:
    port = int(req["master_port"])
    out: Dict[str, Any] = {"port": port}
    if "_bound_by_probe" in req:  # the probe listener already tried this port
        out["bindable"] = bool(req["_bound_by_probe"])
        out["bind_error"] = req.get("_bind_error")
    else:
        from node_agent.ops.probe import bind_error

        error = bind_error(port)
        out["bindable"] = error is None
        if error is not None:
            out["bind_error"] = error
    if out["bindable"]:
        return out
    from node_agent.host.runstate import job_is_supervised
    from node_agent.ops.ports import find_owners

    owners = find_owners(port, "tcp")["owners"]
    for owner in owners:
        job_id = owner.get("ddpctl_job_id")
        owner["job_live"] = bool(job_id) and job_is_supervised(job_id)
    out["owners"] = owners
    return out


def fact_script(req: Dict[str, Any]) -> Dict[str, Any]:
    from node_agent.ops.syncdest import sha256_of

    path = os.path.join(os.path.expanduser(str(req["workdir"])), str(req["script"]))
    if not os.path.isfile(path):
        return {"path": path, "exists": False}
    return {"path": path, "exists": True, "sha256": sha256_of(path), "size": os.stat(path).st_size}


def fact_workdir(req: Dict[str, Any]) -> Dict[str, Any]:
    workdir = os.path.expanduser(str(req.get("workdir") or ""))
    if not workdir or not os.path.isdir(workdir):
        return {"path": workdir, "exists": False}
    usage = shutil.disk_usage(workdir)
    return {"path": workdir, "exists": True, "free_bytes": usage.free, "total_bytes": usage.total,
            "writable": os.access(workdir, os.W_OK)}


# -- [restart] checkpoint_dir -------------------------------------------------------------------
# Doctor asks whether each host can create the directory and write in it, and whether the hosts
# share it: each host writes a marker file the control plane named (request["checkpoint"]:
# {"dir", "marker", "peers": {host: marker}}). In doctor's held session (gather, with a probe)
# the marker stays while the session lasts: the control plane ends the sessions only once every
# host has sent its facts, so every marker is written before any host looks; each host then
# looks for its peers' markers and removes its own (settle_checkpoint). Of two hosts that share
# the directory, the one that looks first sees the other's marker. Elsewhere (one host, a launch)
# the marker is removed at once: only the write is checked. Only a marker this op created
# (O_EXCL) is ever removed, and nothing else.
MARKER_TEXT = b"ddpctl doctor: which hosts share this directory; removed when doctor ends\n"
CHECKPOINT_TIMEOUT_S = 10.0  # a hung network mount answers never: the fact says so instead


def checkpoint_path(req: Dict[str, Any]) -> str:
    """DDPCTL_CHECKPOINT_DIR as the ranks resolve it here: relative to the job's workdir unless
    absolute, `~` this host's (as the supervisor resolves it)."""
    spec = req.get("checkpoint") or {}
    workdir = os.path.expanduser(str(req.get("workdir") or "."))
    return os.path.join(workdir, os.path.expanduser(str(spec.get("dir") or "")))


def valid_marker(name: Any) -> bool:
    """A marker name doctor may create and remove: one plain file name with the marker prefix."""
    return (isinstance(name, str) and name.startswith(DOCTOR_MARKER_PREFIX) and len(name) <= 200
            and "/" not in name and "\0" not in name)


def _own_marker() -> str:
    host = "".join(c if c.isalnum() or c in "._-" else "_" for c in socket.gethostname())[:64]
    return "%s%s-%d-%s" % (DOCTOR_MARKER_PREFIX, host, os.getpid(), os.urandom(4).hex())


def _try_checkpoint(req: Dict[str, Any], keep: bool) -> Dict[str, Any]:
    """Create the directory (where missing), write a marker in it; keep it or remove it."""
    spec = req.get("checkpoint") or {}
    path = checkpoint_path(req)
    out: Dict[str, Any] = {"path": path, "existed": os.path.isdir(path), "writable": False}
    given = spec.get("marker")
    marker = str(given) if valid_marker(given) else _own_marker()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        out.update(step="mkdir", error=str(exc))
        return out
    target = os.path.join(path, marker)
    if not create_file(target, MARKER_TEXT, out):
        return out
    out["writable"] = True
    if keep and marker == given and spec.get("peers"):
        out["marker"] = marker  # settle_checkpoint removes it when the session ends
    else:
        remove_file(target, out)
    return out


def fact_checkpoint(req: Dict[str, Any]) -> Dict[str, Any]:
    """Can this host create [restart] checkpoint_dir (or it exists) and write a file in it?
    {path, existed, writable, step and error where it could not, marker: the one left until the
    session ends}. Bounded: a filesystem that does not answer in CHECKPOINT_TIMEOUT_S is an error
    (its marker, should the write end later, is removed then)."""
    keep = bool(req.get("_keep_marker"))
    box: Dict[str, Any] = {}
    lock = threading.Lock()

    def work() -> None:
        out = _try_checkpoint(req, keep)
        with lock:
            box["out"] = out
            abandoned = box.get("abandoned", False)
        if abandoned and out.get("marker"):
            remove_file(os.path.join(out["path"], out["marker"]), out)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(CHECKPOINT_TIMEOUT_S)
    with lock:
        if "out" in box:
            return dict(box["out"])
        box["abandoned"] = True
    return {"path": checkpoint_path(req), "existed": None, "writable": False, "step": "timeout",
            "error": "no answer from the filesystem within %gs" % CHECKPOINT_TIMEOUT_S}


def settle_checkpoint(request: Dict[str, Any], result: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """At the end of doctor's session (every host has written its marker by now): the peers whose
    marker this host sees in the directory, then its own marker removed. None: it left none."""
    fact = (result.get("facts") or {}).get("checkpoint")
    if not isinstance(fact, dict) or not valid_marker(fact.get("marker")):
        return None
    path, own = str(fact["path"]), str(fact["marker"])
    peers = (request.get("checkpoint") or {}).get("peers") or {}
    out: Dict[str, Any] = {}
    try:
        names = set(os.listdir(path))
    except OSError as exc:
        names = set()
        out["list_error"] = str(exc)
    # By name too: a network filesystem may list a directory from a stale cache, a lookup of a
    # name never looked up before asks the server.
    out["seen"] = sorted(str(host) for host, name in peers.items()
                         if name != own and valid_marker(name)
                         and (name in names or os.path.lexists(os.path.join(path, name))))
    remove_file(os.path.join(path, own), out)
    return out


def fact_prune(req: Dict[str, Any]) -> Dict[str, Any]:
    """A launch's pruning of the oldest run directories here (node_agent/ops/prune.py), in the round
    trip it makes anyway."""
    from node_agent.ops.prune import fact_prune as prune_here

    return prune_here(req)


def fact_metrics_dir(req: Dict[str, Any]) -> Dict[str, Any]:
    """The inventory's metrics_dir here: writable, and read by a node_exporter? (node_agent/ops/metricsdir.py)"""
    from node_agent.ops.metricsdir import fact_metrics_dir as look_here

    return look_here(req)


def fact_infiniband(req: Dict[str, Any]) -> List[str]:
    root = "/sys/class/infiniband"
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def fact_memlock(req: Dict[str, Any]) -> Dict[str, Optional[int]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    return {"soft": None if soft == inf else soft, "hard": None if hard == inf else hard}


def fact_env(req: Dict[str, Any]) -> Dict[str, str]:
    names = set(req.get("env_names") or [])
    prefixes = tuple(req.get("env_prefixes") or ())
    return {k: v for k, v in os.environ.items() if k in names or (prefixes and k.startswith(prefixes))}


def fact_resolution(req: Dict[str, Any]) -> Dict[str, Any]:
    master = fact_resolve(str(req["master_addr"])) if req.get("master_addr") else []
    return {"master": master, "routes": routes_to(master)}


def fact_hostname_resolution(req: Dict[str, Any]) -> List[Dict[str, str]]:
    return fact_resolve(socket.gethostname())


if TYPE_CHECKING:
    Fact = Callable[[Dict[str, Any]], Any]

# Not in doctor's set: doctor reads fact_gpus, and imports torch (fact_torch) where a launch only
# looks it up (fact_torch_lookup)
ON_SELECT_ONLY = frozenset({"gpu_count", "torch_lookup", "prune"})
# Sub-facts that only read this process's state or one small file: run in the agent's own thread
# while the others (commands, name lookups, torch) run in theirs. Doctor runs this op on every
# host at once, and a thread costs each host more than one of these does.
INLINE = frozenset({"python", "cpu_count", "infiniband", "memlock", "env", "free_port"})
# Sub-facts that run only when the request carries their input, selected or not.
NEEDS: Dict[str, Callable[[Dict[str, Any]], bool]] = {
    "script": lambda req: bool(req.get("script")),
    "master_port": lambda req: bool(req.get("check_port") and req.get("master_port")),
    "free_port": lambda req: bool(req.get("pick_port")),
    "checkpoint": lambda req: bool((req.get("checkpoint") or {}).get("dir")),
    "ddpctl_lookup": lambda req: bool(req.get("ddpctl_lookup")),  # doctor, for a job with restarts
    "prune": lambda req: bool(req.get("prune")),  # a launch: [defaults] keep_runs
    "metrics_dir": lambda req: bool(req.get("metrics_dir")),  # the host has one in the inventory
}


def registry() -> Dict[str, Fact]:
    """name -> sub-fact. Built per call, so tests can replace a sub-fact."""
    return {
        "python": fact_python, "torch": fact_torch, "torch_lookup": fact_torch_lookup, "gpus": fact_gpus,
        "interfaces": fact_interfaces,
        "routes": fact_routes,
        "firewall": fact_firewall, "workdir": fact_workdir, "infiniband": fact_infiniband,
        "memlock": fact_memlock, "env": fact_env, "resolution": fact_resolution,
        "hostname_resolution": fact_hostname_resolution, "cpu_count": fact_cpu_count,
        "gpu_count": fact_gpu_count, "script": fact_script, "master_port": fact_master_port,
        "free_port": fact_free_port, "checkpoint": fact_checkpoint, "ddpctl_lookup": fact_ddpctl_lookup,
        "prune": fact_prune, "metrics_dir": fact_metrics_dir,
    }


def sub_facts(req: Dict[str, Any]) -> Tuple[Dict[str, Fact], Dict[str, str]]:
    """The sub-facts this request runs, and an error for each name in its selection that is unknown.
    Without "select": every sub-fact but ON_SELECT_ONLY (doctor's set)."""
    known = registry()
    select = req.get("select")
    if select is None:
        names = [n for n in known if n not in ON_SELECT_ONLY]
    elif isinstance(select, list):
        names = [str(n) for n in select]
    else:
        raise ValueError("select must be a list of fact names, not %r" % (select,))
    table: Dict[str, Fact] = {}
    errors: Dict[str, str] = {}
    for name in names:
        if name == "hostname":
            continue  # always there
        if name not in known:
            errors[name] = "unknown fact"
            continue
        if name not in NEEDS or NEEDS[name](req):
            table[name] = known[name]
    return table, errors


def collect(request: Dict[str, Any], started: float) -> Dict[str, Any]:
    """Run the selected sub-facts (in parallel threads: the torch import dominates) and collect them."""
    facts: Dict[str, Any] = {"hostname": socket.gethostname()}
    table, errors = sub_facts(request)
    names = list(table)
    outcomes = run_all([functools.partial(table[name], request) for name in names], len(names),
                       inline=[i for i, name in enumerate(names) if name in INLINE])
    for i, (value, exc) in enumerate(outcomes):
        name = names[i]
        if exc is None:
            facts[name] = value
        else:
            errors[name] = "%s: %s" % (type(exc).__name__, exc)
    facts["elapsed_s"] = time.monotonic() - started
    facts["time"] = time.time()
    return {"facts": facts, "errors": errors}


def gather(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """The facts op. With request["probe"] = {"ports": [...], "timeout": s} it first listens on
    those ports (event `listening`, with the address its peers should dial), then serves `CONNECT`
    control lines until stdin EOF (see node_agent/ops/probe.py) while it gathers the facts (event
    `facts`): the control plane sends the CONNECT round as soon as every host listens, so a host
    may dial its peers, and send `connected`, before its own facts are out.

    With request["then"] == "supervise" (a launch) it sends the facts as event `facts` too and
    then waits (up to request["hold_s"]) for the control plane's verdict: `START {request}` runs
    the supervise op in this same process, on the same channel (one SSH session per host from
    `ddpctl up` to a running torchrun); EOF means the launch was called off.

    In doctor's session (a probe, no `then`) the checkpoint sub-fact's marker stays until the
    session ends; the result then carries result["checkpoint"] = {seen: the peers whose marker
    this host saw, list_error, cleanup_error} (settle_checkpoint)."""
    started = time.monotonic()
    spec = request.get("probe")
    then = request.get("then") == "supervise"
    if not spec and not then:
        return collect(request, started)
    if spec and not then:  # doctor's session: a checkpoint marker may stay until it ends
        request = dict(request, _keep_marker=True)
    from node_agent.ops import probe

    sockets, ports = probe.open_listeners([int(p) for p in spec.get("ports") or [0]]) if spec else ({}, [])
    if spec:
        net = net_facts(request)
        request = dict(request, _interfaces=net["interfaces"], _routes=net["routes"])
        probe.listening_event(ports, probe.source_toward(str(request.get("master_addr") or "")), net)
    master = [p for p in ports if request.get("master_port") and
              p["requested"] == int(request["master_port"])]
    if master:
        request = dict(request, _bound_by_probe=master[0]["port"] is not None,
                       _bind_error=master[0]["error"])
    timeout = float((spec or {}).get("timeout") or request.get("hold_s") or 120.0)
    start: List[Dict[str, Any]] = []
    served: Dict[str, Any] = {}
    server = threading.Thread(target=lambda: served.update(
        probe.serve(sockets, ports, control, timeout, start if then else None)), daemon=True)
    server.start()
    result = collect(request, started)
    try:
        emit_event("facts", **result)
        server.join()  # until the control plane ends the session: every host's facts are in
    finally:
        settled = settle_checkpoint(request, result)  # never leave the marker behind
    if settled is not None:
        result["checkpoint"] = settled
    if spec:
        result["probe"] = served
    if start:  # the probe's listeners (the master port's among them) are closed by now
        from node_agent.runtime.supervisor import supervise
        return supervise(start[0], control)
    return result
