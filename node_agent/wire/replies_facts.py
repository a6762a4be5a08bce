"""Node agent replies (declared once: node_agent/wire/replies.py): the facts op's answer and its sub-facts.

The facts op (node_agent/ops/facts.py) builds each sub-fact as a plain dict (it runs on every host at
once, and imports no dataclasses for them); these classes declare their shape, and the control
plane decodes them (orchestrator/remote/wire.py parse_facts). Each sub-fact is decoded on its own:
one that does not fit its class is that sub-fact's error, never the host's. Fields a sub-fact may
leave out have defaults, and every sub-fact is None where the host did not send it (not selected,
or its error instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from node_agent.wire.replies_jobs import PruneReport
from node_agent.wire.replies_ports import CheckpointFact, MasterPortFact, ModuleLookupFact

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class PythonFact:
    """The inventory's interpreter, as the agent's PATH finds it (fact_python)."""

    requested: str = "python3"  # the inventory's `python`
    found: Optional[str] = None  # its path (None: not on the PATH)
    agent_executable: str = ""  # the interpreter the agent itself runs under
    agent_version: str = ""
    path_env: str = ""  # the agent's PATH: the launch's context


@dataclass(frozen=True)
class TorchDevice:
    name: str
    memory_mib: int


@dataclass(frozen=True)
class TorchFact:
    """torch as the inventory's interpreter imports it (torch_facts.py TORCH_SNIPPET; maybe cached)."""

    importable: bool = False
    error: Optional[str] = None  # why it is not importable
    python: Optional[str] = None  # that interpreter's version
    executable: Optional[str] = None
    version: Optional[str] = None
    cuda: Optional[str] = None  # torch.version.cuda (None: a CPU build)
    nccl: Optional[str] = None
    cuda_available: Optional[bool] = None
    device_count: Optional[int] = None
    devices: Tuple[TorchDevice, ...] = ()
    cuda_error: Optional[str] = None  # asking CUDA failed
    nccl_backend: Optional[bool] = None
    gloo_backend: Optional[bool] = None
    cached: bool = False  # read from the host's cache (its key unchanged)


@dataclass(frozen=True)
class SmiGpu:
    """One GPU as `nvidia-smi --query-gpu` lists it (factparse.parse_nvidia_gpus)."""

    index: int
    uuid: str
    name: str
    memory_total_mib: Optional[float] = None
    memory_used_mib: Optional[float] = None


@dataclass(frozen=True)
class SmiApp:
    """One compute process as `nvidia-smi --query-compute-apps` lists it, with its owner
    (facts.gpu_app_owner: None where this host's /proc does not show it)."""

    gpu_uuid: str
    pid: int
    name: str = ""
    used_memory_mib: Optional[float] = None
    user: Optional[str] = None
    ddpctl_job_id: Optional[str] = None


@dataclass(frozen=True)
class NvidiaSmiFact:
    """nvidia-smi's GPUs and the processes on them (fact_gpus). The host sends None for the whole
    sub-fact where nvidia-smi is not installed."""

    gpus: Tuple[SmiGpu, ...] = ()
    apps: Tuple[SmiApp, ...] = ()
    user: Optional[str] = None  # the agent's login user


@dataclass(frozen=True)
class InterfaceAddress:
    family: str  # "inet" or "inet6"
    address: str
    prefixlen: Optional[int] = None
    scope: Optional[str] = None  # "global", "host", "link" ...


@dataclass(frozen=True)
class InterfaceFact:
    """One network interface (`ip -j addr`: factparse.parse_ip_addr; else /sys/class/net, without
    addresses)."""

    name: str
    up: bool = False
    operstate: Optional[str] = None
    loopback: bool = False
    addresses: Tuple[InterfaceAddress, ...] = ()


@dataclass(frozen=True)
class TableRoute:
    """One route of the host's IPv4 main table (/proc/net/route: factparse.parse_proc_net_route)."""

    dst: str  # "default" or a CIDR
    dev: Optional[str] = None
    src: Optional[str] = None  # the kernel's table has none: the device's address is the source
    gateway: Optional[str] = None
    metric: int = 0


@dataclass(frozen=True)
class NetFacts:
    """Interfaces and routes, as the probe's `listening` event carries them (facts.net_facts)."""

    interfaces: Tuple[InterfaceFact, ...] = ()
    routes: Tuple[TableRoute, ...] = ()


@dataclass(frozen=True)
class ResolvedAddress:
    family: str  # "inet" or "inet6"
    address: str


@dataclass(frozen=True)
class MasterRoute:
    """`ip -j route get` for an address master_addr resolved to (factparse.parse_route_get), or why
    it failed (`error`)."""

    dev: Optional[str] = None
    src: Optional[str] = None
    gateway: Optional[str] = None
    type: Optional[str] = None  # "local": the address is the host's own
    error: Optional[str] = None


@dataclass(frozen=True)
class ResolutionFact:
    """master_addr as this host resolves it (fact_resolution): its addresses in getaddrinfo's
    order, and the route to the first of each family."""

    master: Tuple[ResolvedAddress, ...] = ()
    routes: Dict[str, MasterRoute] = field(default_factory=dict)  # address -> its route


@dataclass(frozen=True)
class IptablesFact:
    """`iptables -S INPUT` (factparse.parse_iptables_input), or the error running it."""

    policy: Optional[str] = None
    rules: Tuple[str, ...] = ()
    touching_port: Tuple[str, ...] = ()  # rules that name the master port
    blocking: Tuple[str, ...] = ()  # rules that can drop it
    error: Optional[str] = None


@dataclass(frozen=True)
class NftChain:
    name: str
    policy: Optional[str] = None


@dataclass(frozen=True)
class NftFact:
    """`nft list ruleset`'s input-hook chains (factparse.parse_nft_ruleset), or the error."""

    input_chains: Tuple[NftChain, ...] = ()
    blocking: Tuple[str, ...] = ()  # rules that drop or reject the master port
    policy_drop: bool = False
    error: Optional[str] = None


@dataclass(frozen=True)
class UfwFact:
    """`ufw status verbose` (factparse.parse_ufw_status), or the error."""

    active: bool = False
    default_incoming: Optional[str] = None  # "deny", "reject", "allow"
    rules: Tuple[Dict[str, str], ...] = ()  # {"to", "action", "from"}
    error: Optional[str] = None


@dataclass(frozen=True)
class FirewallFact:
    """Each firewall tool's view of the master port (fact_firewall); None: the tool is not installed."""

    iptables: Optional[IptablesFact] = None
    nft: Optional[NftFact] = None
    ufw: Optional[UfwFact] = None


@dataclass(frozen=True)
class WorkdirFact:
    """The job's workdir here (fact_workdir)."""

    path: str = ""  # as the host expanded it
    exists: bool = False
    free_bytes: Optional[int] = None
    total_bytes: Optional[int] = None
    writable: Optional[bool] = None


@dataclass(frozen=True)
class ScriptFact:
    """The job's script in the workdir (fact_script)."""

    path: str = ""
    exists: bool = False
    sha256: Optional[str] = None
    size: Optional[int] = None


@dataclass(frozen=True)
class MemlockFact:
    """RLIMIT_MEMLOCK of the agent (fact_memlock); None: unlimited."""

    soft: Optional[int] = None
    hard: Optional[int] = None


@dataclass(frozen=True)
class MetricsReader:
    """A node_exporter process on the host (its argv read from /proc/<pid>/cmdline)."""

    pid: int
    dirs: Tuple[str, ...] = ()  # its --collector.textfile.directory values, as it names them
    disabled: bool = False  # --no-collector.textfile: it reads no textfile
    # one of dirs is the host's metrics_dir (seen through its /proc/<pid>/root: a container's
    # path may differ); None: the names differ and its root is not the login user's to read
    reads: Optional[bool] = None


@dataclass(frozen=True)
class MetricsDirFact:
    """The inventory's metrics_dir on the host, node_exporter's textfile directory (node_agent/ops/metricsdir.py)."""

    path: str  # as the host expanded it
    user: str = ""  # the login user, who writes the job's textfiles
    exists: bool = False  # (both False also where it did not answer: step "timeout")
    is_dir: bool = False
    writable: Optional[bool] = None  # a file could be created in it (None: not tried, not a directory)
    step: Optional[str] = None  # where the write failed: "write" or "timeout"
    error: Optional[str] = None  # ... with the OS error
    cleanup_error: Optional[str] = None  # doctor's test file could not be removed
    exporters: Optional[Tuple[MetricsReader, ...]] = None  # None: /proc could not be read
    proc_error: Optional[str] = None


@dataclass(frozen=True)
class Facts:
    """The facts op's sub-facts for one host, each under its name in node_agent/ops/facts.py's
    registry (with hostname, elapsed_s and time, which it always sends)."""

    hostname: Optional[str] = None  # socket.gethostname() there
    python: Optional[PythonFact] = None
    torch: Optional[TorchFact] = None  # doctor's: imported by the inventory's interpreter
    torch_lookup: Optional[ModuleLookupFact] = None  # the launch's: looked up, not imported
    gpus: Optional[NvidiaSmiFact] = None  # None also where nvidia-smi is not installed
    interfaces: Optional[Tuple[InterfaceFact, ...]] = None
    routes: Optional[Tuple[TableRoute, ...]] = None
    firewall: Optional[FirewallFact] = None
    workdir: Optional[WorkdirFact] = None
    infiniband: Optional[Tuple[str, ...]] = None  # /sys/class/infiniband's devices
    memlock: Optional[MemlockFact] = None
    env: Optional[Dict[str, str]] = None  # the variables the request named (env_names, env_prefixes)
    resolution: Optional[ResolutionFact] = None
    hostname_resolution: Optional[Tuple[ResolvedAddress, ...]] = None  # the host's own name, resolved there
    cpu_count: Optional[int] = None  # CPUs the agent may run on
    gpu_count: Optional[int] = None  # GPUs the driver knows (the launch's)
    script: Optional[ScriptFact] = None
    master_port: Optional[MasterPortFact] = None
    free_port: Optional[int] = None  # master_port = "auto": a port free right now
    # [restart] checkpoint_dir here; in doctor's session, with what the host saw of its peers'
    # markers once the session ended (the control plane merges CheckpointSeen in)
    checkpoint: Optional[CheckpointFact] = None
    # whether the inventory's interpreter finds ddpctl's CLI (doctor asks the job's first host,
    # where `up --detach` runs a job's restarts)
    ddpctl_lookup: Optional[ModuleLookupFact] = None
    prune: Optional[PruneReport] = None  # a launch's pruning of old run directories
    metrics_dir: Optional[MetricsDirFact] = None  # a host with a metrics_dir in the inventory
    elapsed_s: Optional[float] = None  # the op's time before it read the clock
    time: Optional[float] = None  # the host's clock (time.time()) at the end


@dataclass(frozen=True)
class CheckpointSeen:
    """At the end of doctor's session, what a host saw of its peers' checkpoint markers
    (facts.settle_checkpoint): merged into its CheckpointFact."""

    seen: Optional[Tuple[str, ...]] = None  # hosts whose marker it saw (None: it did not look)
    list_error: Optional[str] = None
    cleanup_error: Optional[str] = None


@dataclass(frozen=True)
class FactsReply:
    """The facts op's answer (its result, or its `facts` event in a held session). `facts` is read
    sub-fact by sub-fact as Facts; an error string replaces each sub-fact that failed."""

    facts: Optional[Dict[str, Any]] = None
    errors: Optional[Dict[str, str]] = None  # sub-fact name -> what went wrong
    checkpoint: Optional[CheckpointSeen] = None  # the result of doctor's session
