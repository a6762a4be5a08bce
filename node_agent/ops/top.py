"""The "top" op: how each ddpctl job on this host is doing, sampled over `interval` seconds.

request: {"job": id, name or run id, or null for every running job; "interval": seconds}.
For each of the job's node states here (runstate.iter_states): whether it runs, its rank processes
alive, each rank's step record (`ranks/<local rank>.step`, which the rank wrapper rewrites), the age
of the node's last output (output.log's mtime), the CPU % and RSS of the job's processes, the tx/rx
rate of the interface its collectives use; and, once for the host, its GPUs (node_agent/host/hoststats.py).
Rates and ages are taken on this host's clock: nothing depends on the control plane's.
The answer is node_agent/wire/replies_top.py's HostTop, sent as `wire(...)`.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from pathlib import Path

from node_agent.host.factparse import parse_proc_net_route
from node_agent.host.hoststats import (
    GpuSample,
    ProcReader,
    cpu_and_rss,
    gpu_sample,
    gpu_select,
    nic_counters,
    nic_rates,
)
from node_agent.host.ifname import match_gloo, match_nccl, nccl_value_is_used
from node_agent.host.procfs import alive, proc_environ, read_stat
from node_agent.host.runstate import JobScan, iter_states, launcher_running, read_json
from node_agent.wire.replies import wire
from node_agent.wire.replies_top import HostTop, RankSteps, TopNode

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Callable, Dict, List, Optional, Sequence, Tuple

MAX_INTERVAL_S = 30.0
STALE_MIN_S = 5.0  # a step record older than max(this, STALE_WINDOWS x its window) is a stalled rank
STALE_WINDOWS = 3.0
GPU_JOIN_S = 8.0  # nvidia-smi's own timeout (5 s) and some


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ended(state: Dict[str, Any]) -> str:
    """How a node that no longer runs ended: its state's status, or "gone" where its supervisor
    died without writing one."""
    status = str(state.get("status") or "")
    return status if status and status != "running" else "gone"


# -- step records -------------------------------------------------------------------------------

def rank_steps(record: Dict[str, Any], now: float) -> RankSteps:
    """One rank's step record as top shows it: steps/s over its last window (0 once the record is
    older than max(STALE_MIN_S, STALE_WINDOWS x the window's seconds): a stalled rank), p50/p95."""
    window = record.get("window")
    if not isinstance(window, dict):
        window = {}
    steps, seconds = window.get("steps"), window.get("seconds")
    stamp = record.get("time")
    age = max(0.0, now - float(stamp)) if isinstance(stamp, (int, float)) else None
    span = float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else 0.0
    stalled = age is not None and age > max(STALE_MIN_S, STALE_WINDOWS * span)
    rate = None
    if stalled:
        rate = 0.0
    elif span and isinstance(steps, (int, float)):
        rate = round(float(steps) / span, 3)
    rank = _int(record.get("rank"))
    return RankSteps(rank=rank if rank is not None and rank >= 0 else None, local_rank=_int(record.get("local_rank")),
                     step=_int(record.get("step")), total=_int(record.get("total")),
                     age_s=None if age is None else round(age, 2), steps_per_s=rate,
                     p50_ms=_float(window.get("p50_ms")), p95_ms=_float(window.get("p95_ms")), stalled=stalled)


def read_steps(rank_dir: Path, now: float) -> List[RankSteps]:
    """Every rank's step record in a node's rank directory, by local rank."""
    try:
        names = sorted(os.listdir(str(rank_dir)))
    except OSError:
        return []
    out = []
    for name in names:
        local, _, phase = name.partition(".")
        if phase != "step" or not local.isdigit():
            continue
        record = read_json(rank_dir / name)
        if isinstance(record, dict):
            out.append(rank_steps(record, now))
    return sorted(out, key=lambda r: r.local_rank or 0)


# -- the job's interface ------------------------------------------------------------------------

def _flag(argv: Sequence[str], *names: str) -> Optional[str]:
    """The value of `--name VALUE` or `--name=VALUE` in argv."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return str(argv[i + 1])
            if arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return None


def master_address(state: Dict[str, Any], rank_env: Optional[Dict[str, str]]) -> Optional[str]:
    """The job's master (rendezvous) address: a rank's MASTER_ADDR, else torchrun's argv."""
    if rank_env and rank_env.get("MASTER_ADDR"):
        return rank_env["MASTER_ADDR"]
    argv = [str(a) for a in state.get("argv") or ()]
    addr = _flag(argv, "--master-addr", "--master_addr")
    if addr:
        return addr
    endpoint = _flag(argv, "--rdzv-endpoint", "--rdzv_endpoint")
    if endpoint:
        return endpoint.rsplit(":", 1)[0].strip("[]") if ":" in endpoint else endpoint
    return None


def route_interface(address: str, routes: List[Dict[str, Any]]) -> Optional[str]:
    """The interface of this host's IPv4 route to `address` (longest prefix; loopback: lo)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.is_loopback:
        return "lo"
    best: Optional[Tuple[int, str]] = None
    for r in routes:
        net = ipaddress.ip_network("0.0.0.0/0" if r["dst"] == "default" else r["dst"], strict=False)
        if ip in net and (best is None or net.prefixlen > best[0]):
            best = (int(net.prefixlen), str(r["dev"]))
    return best[1] if best else None


def _resolve(host: str) -> Optional[str]:
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
    except (OSError, IndexError, UnicodeError):
        return None


def job_interfaces(env: Dict[str, str], master: Optional[str], names: Sequence[str]) -> Tuple[List[str], str]:
    """The interfaces the job's collectives use and why: NCCL_SOCKET_IFNAME (as NCCL matches it),
    else GLOO_SOCKET_IFNAME, else the interface of the route to the master address."""
    nccl = env.get("NCCL_SOCKET_IFNAME")
    if nccl_value_is_used(nccl):
        return match_nccl(str(nccl), names), "NCCL_SOCKET_IFNAME=%s" % nccl
    gloo = env.get("GLOO_SOCKET_IFNAME")
    if gloo:
        return match_gloo(gloo, names), "GLOO_SOCKET_IFNAME=%s" % gloo
    if not master:
        return [], "no master address"
    address = master if _is_ip(master) else _resolve(master)
    if address is None:
        return [], "master %s does not resolve" % master
    try:
        with open("/proc/net/route") as f:
            routes = parse_proc_net_route(f.read())
    except OSError:
        routes = []
    dev = route_interface(address, routes)
    return ([dev] if dev else []), "route to %s" % master


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def rank_processes(pids: Sequence[int]) -> Dict[int, Dict[str, str]]:
    """pid -> environment of the job's rank processes among `pids`: those carrying torchrun's RANK
    whose parent does not (a rank's DataLoader workers inherit RANK too)."""
    envs = {p: e for p, e in ((p, proc_environ(p)) for p in pids) if "RANK" in e}
    ranks = {}
    for pid, env in envs.items():
        stat = read_stat(pid)
        if stat is not None and stat.ppid not in envs:
            ranks[pid] = env
    return ranks


# -- one node of a job --------------------------------------------------------------------------

class Node(object):
    """One node state of a job on this host and what is sampled of it."""

    def __init__(self, state: Dict[str, Any]) -> None:
        self.state = state
        self.running = launcher_running(state)
        self.scan = JobScan(state["job_id"], state.get("node_rank"))  # called again, it reads only new pids
        self.pids: List[int] = self.scan() if self.running else []
        self.rank_envs = rank_processes(self.pids)
        # the job's environment: the supervisor keeps no copy of its request, torchrun's has it all
        launcher = proc_environ(int(state["pid"])) if self.running else {}
        self.env: Dict[str, str] = dict(launcher)
        self.env.update({str(k): str(v) for k, v in (state.get("env") or {}).items()})
        self.ifaces: List[str] = []
        self.iface_source = ""

    def pick_interfaces(self, names: Sequence[str]) -> None:
        rank_env = next(iter(self.rank_envs.values()), None)
        self.ifaces, self.iface_source = job_interfaces(self.env, master_address(self.state, rank_env), names)

    def expected_ranks(self) -> Optional[int]:
        nproc = _flag([str(a) for a in self.state.get("argv") or ()], "--nproc-per-node", "--nproc_per_node")
        return int(nproc) if nproc and nproc.isdigit() else None

    def report(self, cpu_pct: Optional[float], rss: Optional[int], rates: Tuple[Optional[float], Optional[float]],
               now: float) -> TopNode:
        state = self.state
        sdir = Path(str(state.get("state_dir") or "."))
        log = Path(str(state.get("log") or sdir / "output.log"))
        try:
            log_age: Optional[float] = round(max(0.0, now - os.stat(str(log)).st_mtime), 2)
        except OSError:
            log_age = None
        alive_ranks = sum(1 for p in self.rank_envs if alive(p))
        name = state.get("job_name")
        return TopNode(
            job_id=str(state["job_id"]), job_name=None if name is None else str(name),
            node_rank=_int(state.get("node_rank")), running=self.running,
            status="running" if self.running else _ended(state), exit_code=_int(state.get("exit_code")),
            ranks_alive=alive_ranks if self.running else 0, ranks_expected=self.expected_ranks(),
            ranks=tuple(read_steps(sdir / "ranks", now)), log_age_s=log_age,
            iface=",".join(self.ifaces) or None, iface_source=self.iface_source or None,
            tx_bytes_per_s=rates[0], rx_bytes_per_s=rates[1], cpu_pct=cpu_pct, rss_bytes=rss,
            processes=len(self.pids), gpu_select=gpu_select(self.env) if self.running else None)


def _nodes(job: Optional[str]) -> List[Node]:
    """The node states to report: every running one (of `job`, or of any job); asked for a job
    that runs nowhere here, its newest state (to say how it ended)."""
    states = list(iter_states(job))
    nodes = [Node(s) for s in states]
    running = [n for n in nodes if n.running]
    if running or not job or not nodes:
        return running
    return [max(nodes, key=lambda n: float(n.state.get("started_at") or 0))]


class GpuSampler(object):
    """The GPU sample, taken in a thread while the op waits out its interval."""

    def __init__(self, gpus: Callable[[], GpuSample]) -> None:
        self.gpus = gpus
        self.result: Optional[GpuSample] = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.gpus()
        except Exception as exc:  # never the whole op's failure: the rows say it
            self.result = GpuSample((), "sampling the GPUs failed: %s: %s" % (type(exc).__name__, exc), True)

    def join(self) -> GpuSample:
        self.thread.join(GPU_JOIN_S)
        return self.result or GpuSample((), "nvidia-smi did not finish in %.0f s" % GPU_JOIN_S, True)


def measure(live: List[Node], interval: float, sleep: Callable[[float], None],
            reader: ProcReader) -> Tuple[Dict[int, Tuple[Optional[float], Optional[int],
                                                          Tuple[Optional[float], Optional[float]]]], float]:
    """CPU %, RSS and the interfaces' tx/rx of each running node over `interval` seconds: id(node)
    -> (cpu %, rss, (tx, rx)); and the seconds the interval really took."""
    nic_before = nic_counters()
    for n in live:
        n.pick_interfaces(list(nic_before))
    before = {id(n): reader.sample(n.pids) for n in live}
    started = time.monotonic()
    if interval:
        sleep(interval)
    nic_after = nic_counters()
    seconds = time.monotonic() - started
    out: Dict[int, Tuple[Optional[float], Optional[int], Tuple[Optional[float], Optional[float]]]] = {}
    for n in live:
        n.pids = sorted(set(n.pids) | set(n.scan()))  # and the processes started meanwhile
        cpu, rss = cpu_and_rss(before[id(n)], reader.sample(n.pids), seconds)
        out[id(n)] = (cpu, rss, nic_rates(n.ifaces, nic_before, nic_after, seconds))
    return out, seconds


def host_top(job: Optional[str], interval: float, sleep: Callable[[float], None] = time.sleep,
             use_psutil: Optional[bool] = None, gpus: Callable[[], GpuSample] = gpu_sample) -> HostTop:
    """Sample this host for `top`: every node of `job` here, `interval` seconds apart (no wait when
    nothing runs), and the GPUs once meanwhile."""
    gpu = GpuSampler(gpus)
    nodes = _nodes(job)
    live = [n for n in nodes if n.running]
    reader = ProcReader(use_psutil) if live else None
    measured, seconds = measure(live, max(0.0, min(float(interval), MAX_INTERVAL_S)), sleep, reader) \
        if reader is not None else ({}, 0.0)
    now = time.time()
    reports = tuple(n.report(*measured.get(id(n), (None, None, (None, None))), now=now) for n in nodes)
    got = gpu.join()
    return HostTop(hostname=socket.gethostname(), interval_s=round(seconds, 3), gpus=tuple(got.gpus),
                   gpu_error=got.error, nvidia_smi=bool(got.nvidia_smi),
                   proc_source=reader.source if reader else None, nodes=reports)


def sample(job: Optional[str], interval: float, sleep: Callable[[float], None] = time.sleep,
           use_psutil: Optional[bool] = None, gpus: Callable[[], GpuSample] = gpu_sample) -> Dict[str, Any]:
    """The top op's reply: host_top's sample as its JSON object."""
    return wire(host_top(job, interval, sleep, use_psutil, gpus))


def top(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    job = request.get("job")
    return sample(str(job) if job else None, float(request.get("interval") or 0.0))
