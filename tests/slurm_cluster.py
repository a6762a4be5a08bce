"""A real multi-node Slurm cluster on this machine, for integration tests.

One network namespace per node on a bridge, as the SSH cluster of tests/cluster.py builds them:
a login namespace that runs `munged`, `slurmctld` (its hostname is SlurmctldHost) and an `sshd`,
and one namespace per compute node running its own `slurmd`. Every daemon is entered with
`nsenter --net=... unshare --uts --mount --propagation private`, never `ip netns exec` (that
remounts /sys and so hides the cgroup hierarchies proctrack/cgroup needs). Inside, a private
mount namespace binds the cluster's hosts file over /etc/hosts and its Slurm configuration over
the default path, so `srun`/`scontrol` in batch jobs and commands run over SSH on the login node
need no SLURM_CONF. The root namespace gets no Slurm configuration: clients there use
`client_env` (SLURM_CONF=<cluster>/etc/slurm.conf). See /work/shared/SLURM-RECIPE.md.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tests import cluster_files as files
from tests.cluster_sys import (
    REGISTRY,
    START_TIMEOUT_S,
    ClusterError,
    ip_batch,
    kill,
    kill_netns,
    leftovers,
    netns_pids,
    pick_network,
    pid_alive,
    read_pid,
    reap_stale_clusters,
    registry_lock,
    remove_network,
    run_all,
    start_time,
    unavailable_reason,
    wait_until,
    which,
)
from tests.required import missing

__all__ = ["ClusterError", "SlurmCluster", "reap_stale_slurm_clusters", "require_slurm",
           "slurm_leftovers", "slurm_unavailable_reason", "start_slurm_cluster"]

SLURM_REGISTRY = REGISTRY / "slurm"  # apart from the SSH clusters' records: reaped here, cgroups too
CGROUP_ROOT = Path("/sys/fs/cgroup")
ETC_SLURM = Path("/etc/slurm")
MAX_PREFIX_LEN = 10  # "<prefix>-v99" must fit Linux's 15-character interface names
MAX_NODES = 99
CPUS = 2
REAL_MEMORY_MB = 2000
LOGIN_ALIAS = "login"
SSH_PORT = 22
_UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
# Runs inside fresh UTS + private mount namespaces: hostname $1, then bind-mount SRC DST pairs
# up to "--", then exec the rest (argv is never a string).
_ENTER = ('set -e; hostname "$1"; shift; '
          'while [ "$1" != "--" ]; do mount --bind "$1" "$2"; shift 2; done; shift; exec "$@"')


def slurm_unavailable_reason() -> str | None:
    """Why a Slurm cluster cannot be built here (None: it can)."""
    reason = unavailable_reason()  # root, sshd, ssh, ssh-keygen, ip, unshare, namespaces
    if reason is not None:
        return reason
    tools = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "squeue", "scontrol", "scancel",
             "srun", "nsenter", "mount", "hostname")
    missing = [t for t in tools if which(t) is None]
    if missing:
        return (f"the Slurm test cluster needs {', '.join(missing)}: apt-get install -y "
                "slurm-wlm slurmctld slurmd slurm-client munge util-linux")
    if not ETC_SLURM.is_dir():
        return f"{ETC_SLURM} is missing (the Slurm packages make it): nothing to bind the config over"
    if not (CGROUP_ROOT / "freezer").is_dir():
        return f"proctrack/cgroup (cgroup v1) needs the freezer hierarchy at {CGROUP_ROOT}/freezer"
    return None


def require_slurm() -> None:
    """For tests: skip when no Slurm cluster can be built; fail instead under DDPCTL_REQUIRE_CLUSTER=1."""
    reason = slurm_unavailable_reason()
    if reason is not None:
        missing(reason)


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _cgroup_dirs(nodes: Sequence[str]) -> list[Path]:
    """The per-node cgroup directories the Debian build makes: /sys/fs/cgroup/*/slurm_<node>."""
    return [d for node in nodes for d in sorted(CGROUP_ROOT.glob(f"*/slurm_{node}")) if d.is_dir()]


def _remove_cgroups(nodes: Sequence[str]) -> None:
    """rmdir every per-node cgroup directory, deepest first (cgroupfs only removes empty ones)."""
    def gone() -> bool:
        for top in _cgroup_dirs(nodes):
            for sub, _, _ in os.walk(top, topdown=False):  # children before their parent
                with suppress(OSError):
                    os.rmdir(sub)
        return not _cgroup_dirs(nodes)

    with suppress(ClusterError):  # a dir that stays is reported by slurm_leftovers
        wait_until(gone, 10.0, "the per-node cgroup directories to go")


def slurm_leftovers(prefix: str, nodes: Sequence[str]) -> list[str]:
    """Namespaces, links and cgroup directories of a cluster (empty after a clean teardown)."""
    return leftovers(prefix) + [f"cgroup {d}" for d in _cgroup_dirs(nodes)]


@dataclass
class SlurmCluster:
    """A running Slurm cluster; `teardown()` (or leaving `with`) removes every trace of it."""

    prefix: str
    workdir: Path
    network: ipaddress.IPv4Network
    nodes: list[str]  # NodeNames, which are also the compute nodes' hostnames
    login_alias: str = LOGIN_ALIAS
    settings: dict[str, str] = field(default_factory=dict)  # slurm.conf lines the test sets (Key=Value)
    bring_up_s: float = 0.0
    teardown_s: float = 0.0
    _torn_down: bool = False
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # -- names, addresses and paths -----------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the bridge (the nodes reach this machine here)."""
        return str(self.network.network_address + 1)

    @property
    def login_hostname(self) -> str:
        """The login node's hostname: SlurmctldHost."""
        return f"{self.prefix}-login"

    @property
    def login_address(self) -> str:
        return str(self.network.network_address + 10)

    def node_address(self, i: int) -> str:
        return str(self.network.network_address + 11 + i)

    @property
    def login_netns(self) -> str:
        return f"{self.prefix}-login"

    def node_netns(self, i: int) -> str:
        return self.nodes[i]  # "<prefix>-c<i+1>", like the node's name

    @property
    def namespaces(self) -> list[str]:
        return [self.login_netns, *self.nodes]

    @property
    def veths(self) -> list[str]:
        return [f"{self.prefix}-v{k}" for k in range(len(self.nodes) + 1)]  # v0: the login node

    @property
    def conf_dir(self) -> Path:
        """slurm.conf and cgroup.conf; bind-mounted over /etc/slurm inside every namespace."""
        return self.workdir / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.conf_dir / "slurm.conf"

    @property
    def client_env(self) -> dict[str, str]:
        """Add to the environment of Slurm clients run in the root namespace."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    @property
    def munge_socket(self) -> Path:
        return self.workdir / "munge" / "munge.socket.2"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "log"

    @property
    def run_dir(self) -> Path:
        return self.workdir / "run"

    @property
    def ssh_dir(self) -> Path:
        return self.workdir / "ssh"

    @property
    def key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def host_key(self) -> Path:
        return self.ssh_dir / "ssh_host_ed25519_key"

    @property
    def authorized_keys(self) -> Path:
        return self.ssh_dir / "authorized_keys"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        """Host `login_alias`: the login node as root, with the cluster's key and known_hosts."""
        return self.ssh_dir / "ssh_config"

    def _pid_files(self) -> list[tuple[Path, str]]:
        """(pid file, /proc/PID/comm) of every daemon the fixture starts."""
        return [(self.workdir / "munge" / "munged.pid", "munged"),
                (self.run_dir / "slurmctld.pid", "slurmctld"),
                *[(self.run_dir / f"slurmd-{n}.pid", "slurmd") for n in self.nodes],
                (self.ssh_dir / "sshd.pid", "sshd")]

    def _daemon_pid(self, pid_file: Path, comm: str) -> int | None:
        pid = read_pid(pid_file)
        if pid is None or not pid_alive(pid) or _comm(pid) != comm:
            return None
        return pid

    # -- use ------------------------------------------------------------------------------------
    def slurm(self, *argv: str, timeout: float = 60.0,
              check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (`sbatch`, `squeue`, ...) from the root namespace."""
        env = {**os.environ, **self.client_env}
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise ClusterError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def ssh_argv(self, *remote: str) -> list[str]:
        """OpenSSH client argv that runs `remote` on the login node (remote words joined by ssh)."""
        return ["ssh", "-F", str(self.ssh_config), self.login_alias, *remote]

    def node_pids(self, i: int) -> list[int]:
        """Live pids in compute node `i`'s namespace (0-based) except its slurmd: job processes."""
        slurmd = self._daemon_pid(self.run_dir / f"slurmd-{self.nodes[i]}.pid", "slurmd")
        return [pid for pid in netns_pids(self.node_netns(i)) if pid != slurmd]

    def kill_slurmd(self, i: int) -> int:
        """SIGKILL compute node `i`'s slurmd (its job steps run on); its pid."""
        pid = self._daemon_pid(self.run_dir / f"slurmd-{self.nodes[i]}.pid", "slurmd")
        if pid is None:
            raise ClusterError(f"no slurmd runs on {self.nodes[i]}")
        kill(pid, signal.SIGKILL)
        return pid

    def idle_nodes(self) -> list[str]:
        proc = self.slurm("sinfo", "-h", "-N", "-t", "idle", "-o", "%N", timeout=20.0)
        return sorted(set(proc.stdout.split())) if proc.returncode == 0 else []

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until every node is idle (none allocated, completing, down or drained)."""
        try:
            wait_until(lambda: self.idle_nodes() == sorted(self.nodes), timeout,
                       f"nodes {', '.join(self.nodes)} to be idle")
        except ClusterError as err:
            state = self.slurm("sinfo", "-N", "-o", "%N %T %E", timeout=20.0)
            raise ClusterError(f"{err}; sinfo:\n{state.stdout}{state.stderr}") from None

    def scheduler_cycles(self) -> int:
        """How many main scheduling cycles slurmctld has run (`sdiag`; 0 if it does not answer)."""
        out = self.slurm("sdiag", timeout=20.0).stdout
        main = out.split("Main schedule statistics", 1)[-1].split("Backfilling stats", 1)[0]
        found = re.search(r"Total cycles:\s*(\d+)", main)
        return int(found.group(1)) if found else 0

    def _wait_scheduler(self, timeout: float) -> None:
        """slurmctld runs its first scheduling cycle about 3 s after it starts, and no job starts
        before: wait for it, so that the first job starts as soon as later ones do."""
        wait_until(lambda: self.scheduler_cycles() > 0, timeout, "slurmctld's first scheduling cycle")

    # -- life cycle -------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.teardown()

    def _create_network(self) -> None:
        lines = [f"link add {self.bridge} type bridge",
                 f"addr add {self.bridge_address}/{self.network.prefixlen} dev {self.bridge}",
                 f"link set {self.bridge} up"]
        for netns, veth in zip(self.namespaces, self.veths, strict=True):
            lines += [f"netns add {netns}",
                      f"link add {veth} type veth peer name eth0 netns {netns}",
                      f"link set {veth} master {self.bridge} up"]
        ip_batch(lines)
        addresses = [self.login_address, *(self.node_address(i) for i in range(len(self.nodes)))]
        inner = [["link set lo up", f"addr add {a}/{self.network.prefixlen} dev eth0",
                  "link set eth0 up"] for a in addresses]
        run_all([["ip", "-n", ns, "-batch", "-"] for ns in self.namespaces],
                ["\n".join(cmds) + "\n" for cmds in inner])

    def _write_files(self) -> None:
        for d in (self.conf_dir, self.log_dir, self.run_dir, self.ssh_dir, self.munge_socket.parent,
                  self.workdir / "state" / "ctld", *(self.workdir / "state" / n for n in self.nodes)):
            d.mkdir(parents=True, exist_ok=True)
        self.munge_socket.parent.chmod(0o700)
        key = self.workdir / "munge" / "munge.key"
        key.unlink(missing_ok=True)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(1024))
        (self.workdir / "hosts").write_text(
            "127.0.0.1 localhost\n::1 localhost\n" f"{self.login_address} {self.login_hostname}\n"
            + "".join(f"{self.node_address(i)} {n}\n" for i, n in enumerate(self.nodes)))
        # DNS goes to each namespace's own loopback, where nothing answers: no query leaves.
        (self.workdir / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        self.slurm_conf.write_text(self._slurm_conf_text())
        (self.conf_dir / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainCores=yes\n"
            "ConstrainRAMSpace=no\nConstrainDevices=no\n")
        files.make_keys(self.key, self.host_key)
        self.authorized_keys.write_text(self.key.with_suffix(".pub").read_text())
        files.write_known_hosts(self.known_hosts, [self.login_address], SSH_PORT,
                                self.host_key.with_suffix(".pub").read_text().split())
        files.write_ssh_config(self.ssh_config, [(self.login_alias, self.login_address)], SSH_PORT,
                               self.key, self.known_hosts)
        files.write_sshd_config(self.ssh_dir / "sshd_config", self.login_address, SSH_PORT,
                                self.host_key, self.ssh_dir / "sshd.pid", self.authorized_keys)

    def _slurm_conf_text(self) -> str:
        d = self.workdir
        node_list = ",".join(self.nodes)
        lines = [
            f"# Written by tests/slurm_cluster.py for test cluster {self.prefix}.",
            f"ClusterName={self.prefix}",
            f"SlurmctldHost={self.login_hostname}({self.login_address})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/state/ctld",
            f"SlurmdSpoolDir={d}/state/%n",
            f"SlurmctldPidFile={self.run_dir}/slurmctld.pid",
            f"SlurmdPidFile={self.run_dir}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log",
            f"SlurmdLogFile={self.log_dir}/slurmd-%n.log",
            "SlurmctldPort=6817",
            "SlurmdPort=6818",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ProctrackType=proctrack/cgroup",
            "TaskPlugin=task/cgroup,task/affinity",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            # Nodes are declared with CPUs/RealMemory below, whatever this machine has.
            "SlurmdParameters=config_overrides",
            # Schedule a batch job when it is submitted, not up to 3 s later (the default); and run
            # the main scheduling loop every 2 s, not 60 s: slurmctld's first cycle is otherwise
            # triggered only by an event at start-up, and a CI run once saw none within 20 s.
            "SchedulerParameters=batch_sched_delay=0,sched_interval=2",
            "ReturnToService=2",
            "KillWait=5",
            "MinJobAge=300",
            "InactiveLimit=0",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            *[f"NodeName={n} NodeHostname={n} NodeAddr={self.node_address(i)} CPUs={CPUS} "
              f"RealMemory={REAL_MEMORY_MB} State=UNKNOWN" for i, n in enumerate(self.nodes)],
            f"PartitionName=debug Nodes={node_list} Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName=short Nodes={node_list} MaxTime=00:10:00 MaxNodes=1 State=UP",
        ]
        for key, value in self.settings.items():  # a test's own limits (e.g. SlurmdTimeout) replace ours
            lines = [line for line in lines if not line.startswith(f"{key}=")]
            lines.insert(lines.index("SlurmctldDebug=info"), f"{key}={value}")
        return "\n".join(lines) + "\n"

    def _binds(self) -> list[str]:
        """SRC DST pairs bound inside every namespace: hosts, resolv.conf and the Slurm config."""
        binds = [str(self.workdir / "hosts"), "/etc/hosts"]
        if Path("/etc/resolv.conf").exists():
            binds += [str(self.workdir / "resolv.conf"), "/etc/resolv.conf"]
        if (ETC_SLURM / "slurm.conf").exists():  # bind over the files: mount targets must exist
            binds += [str(self.slurm_conf), str(ETC_SLURM / "slurm.conf")]
            if (ETC_SLURM / "cgroup.conf").exists():
                binds += [str(self.conf_dir / "cgroup.conf"), str(ETC_SLURM / "cgroup.conf")]
        else:  # creating /etc/slurm/slurm.conf would show in the root namespace: bind the directory
            binds += [str(self.conf_dir), str(ETC_SLURM)]
        return binds

    def _enter_argv(self, netns: str, hostname: str, argv: Sequence[str]) -> list[str]:
        return [str(which("nsenter")), f"--net=/run/netns/{netns}", str(which("unshare")), "--uts",
                "--mount", "--propagation", "private", "sh", "-c", _ENTER, "sh", hostname,
                *self._binds(), "--", *argv]

    def _start(self, starts: Sequence[tuple[str, str, Sequence[str], str]]) -> None:
        """Start daemons concurrently: (netns, hostname, argv, log name) each; they fork away."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        procs = []
        for netns, hostname, argv, name in starts:
            with open(self.log_dir / f"{name}.out", "ab") as out:
                procs.append(subprocess.Popen(self._enter_argv(netns, hostname, argv),
                                              stdin=subprocess.DEVNULL, stdout=out,
                                              stderr=subprocess.STDOUT, env=env))
        self._procs += procs
        errors = []
        for (_, _, argv, name), proc in zip(starts, procs, strict=True):
            try:
                rc = proc.wait(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                errors.append(f"{argv[0]} did not return after {START_TIMEOUT_S:.0f}s")
                continue
            if rc != 0:
                errors.append(f"`{' '.join(argv)}` exited {rc}: {self._log_tail(name)}")
        if errors:
            raise ClusterError("; ".join(errors))

    def _log_tail(self, name: str) -> str:
        texts = []
        for log in (self.log_dir / f"{name}.out", self.log_dir / f"{name}.log"):
            with suppress(OSError):
                texts.append(f"{log}:\n{log.read_text()[-2000:]}")
        return "\n".join(texts)

    def _wait_daemon(self, pid_file: Path, comm: str, name: str) -> None:
        try:
            wait_until(lambda: self._daemon_pid(pid_file, comm) is not None, START_TIMEOUT_S,
                       f"{name} to write {pid_file}")
        except ClusterError as err:
            raise ClusterError(f"{err}; {self._log_tail(name)}") from None

    def _start_daemons(self) -> None:
        munge = self.munge_socket.parent
        self._start([(self.login_netns, self.login_hostname, [
            str(which("munged")), "--force", f"--socket={self.munge_socket}",
            f"--key-file={munge / 'munge.key'}", f"--pid-file={munge / 'munged.pid'}",
            f"--seed-file={munge / 'munge.seed'}", f"--log-file={self.log_dir / 'munged.log'}"],
            "munged")])
        self._wait_daemon(munge / "munged.pid", "munged", "munged")
        wait_until(self.munge_socket.exists, START_TIMEOUT_S, f"munged to create {self.munge_socket}")
        # No `-f`: the daemons read the config at the default path, as on a real cluster, and
        # jobs see SLURM_CONF=/etc/slurm/slurm.conf (the bind mount), not a path in workdir.
        self._start([
            (self.login_netns, self.login_hostname, [str(which("slurmctld"))], "slurmctld"),
            (self.login_netns, self.login_hostname, [
                str(which("sshd")), "-f", str(self.ssh_dir / "sshd_config"),
                "-E", str(self.log_dir / "sshd.log")], "sshd"),
            *[(self.node_netns(i), n, [str(which("slurmd"))], f"slurmd-{n}")
              for i, n in enumerate(self.nodes)],
        ])
        for pid_file, comm in self._pid_files()[1:]:  # munged's is waited for above
            self._wait_daemon(pid_file, comm, pid_file.stem)  # stem = log name: slurmd-<node>, ...

    def teardown(self) -> None:
        """Kill every daemon and job, delete namespaces, veths, bridge and cgroups, then verify."""
        if self._torn_down:
            return
        self._torn_down = True
        started = time.monotonic()
        _LIVE.pop(id(self), None)
        for pid_file, comm in self._pid_files():
            pid = self._daemon_pid(pid_file, comm)
            if pid is not None:
                kill(pid, signal.SIGKILL)
        for proc in self._procs:
            if proc.poll() is None:
                kill(proc.pid, signal.SIGKILL)
        try:
            kill_netns(self.namespaces)  # job processes, slurmstepds, whatever else is left
        finally:  # even if a process would not die: the network and the record go
            for proc in self._procs:
                with suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            remove_network(self.bridge, self.veths, self.namespaces)
            _remove_cgroups(self.nodes)
            (SLURM_REGISTRY / f"{self.prefix}.json").unlink(missing_ok=True)
            self.teardown_s = time.monotonic() - started
        left = slurm_leftovers(self.prefix, self.nodes)
        left += [f"{comm} pid {pid}" for pid_file, comm in self._pid_files()
                 if (pid := self._daemon_pid(pid_file, comm)) is not None]
        if left:
            raise ClusterError(f"teardown of Slurm cluster {self.prefix} left {', '.join(left)}")


_LIVE: dict[int, SlurmCluster] = {}


@atexit.register
def _teardown_live() -> None:
    for cluster in list(_LIVE.values()):
        try:
            cluster.teardown()
        except ClusterError as err:
            print(f"warning: {err}", file=sys.stderr)


def reap_stale_slurm_clusters() -> list[str]:
    """Tear down Slurm clusters whose owning process died without cleaning up (munged too lives
    in a namespace: its socket is a path, which network namespaces do not separate)."""
    return reap_stale_clusters(SLURM_REGISTRY, lambda record: _remove_cgroups(record["nodes"]))


def _register(cluster: SlurmCluster) -> None:
    SLURM_REGISTRY.mkdir(parents=True, exist_ok=True)
    record = {"prefix": cluster.prefix, "owner": os.getpid(),
              "owner_start": start_time(os.getpid()), "bridge": cluster.bridge,
              "netns": cluster.namespaces, "veths": cluster.veths, "nodes": cluster.nodes,
              "pid_files": [str(p) for p, _ in cluster._pid_files()]}
    (SLURM_REGISTRY / f"{cluster.prefix}.json").write_text(json.dumps(record))
    _LIVE[id(cluster)] = cluster


def _check_request(n_nodes: int, prefix: str, workdir: Path) -> None:
    if not 1 <= n_nodes <= MAX_NODES:
        raise ClusterError(f"start_slurm_cluster(n_nodes={n_nodes}): must be between 1 and {MAX_NODES}")
    if not (prefix.isascii() and prefix.isalnum() and prefix == prefix.lower() and len(prefix) <= MAX_PREFIX_LEN):
        raise ClusterError(f"prefix {prefix!r}: use at most {MAX_PREFIX_LEN} lowercase letters/digits")
    if not re.fullmatch(r"[A-Za-z0-9_./+-]+", str(workdir)):
        raise ClusterError(f"workdir {workdir}: slurm.conf paths need letters, digits and _ . / + -")
    socket = workdir / "munge" / "munge.socket.2"
    if len(str(socket)) > _UNIX_PATH_MAX:
        raise ClusterError(f"workdir {workdir} is too long: the munge socket {socket} must fit "
                           f"{_UNIX_PATH_MAX} bytes")
    if leftovers(prefix):
        raise ClusterError(f"prefix {prefix!r} is in use: {', '.join(leftovers(prefix))}")


def start_slurm_cluster(n_nodes: int, workdir: Path, prefix: str | None = None,
                        settings: dict[str, str] | None = None) -> SlurmCluster:
    """Bring up a login node (munged, slurmctld, sshd) and `n_nodes` compute nodes, all idle,
    and return once slurmctld schedules (a job submitted then starts within about a second).

    Compute nodes are `<prefix>-c1`..`<prefix>-c<n>` (NodeName = hostname); partitions `debug`
    (default, no time limit) and `short` (MaxTime 10 min, MaxNodes 1). Use it as a context
    manager or call `teardown()`; an atexit hook and a record under /run/ddpctl-cluster/slurm
    reap it if its owner dies.
    """
    started = time.monotonic()
    reason = slurm_unavailable_reason()
    if reason is not None:
        raise ClusterError(reason)
    prefix = prefix or f"sl{secrets.token_hex(2)}"
    workdir = Path(workdir).resolve()
    _check_request(n_nodes, prefix, workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    with registry_lock():
        reap_stale_slurm_clusters()
        reap_stale_clusters()
        cluster = SlurmCluster(prefix=prefix, workdir=workdir, network=pick_network(), settings=dict(settings or {}),
                               nodes=[f"{prefix}-c{i}" for i in range(1, n_nodes + 1)])
        _register(cluster)
        try:
            cluster._create_network()
        except BaseException:
            cluster.teardown()
            raise
    try:
        cluster._write_files()
        cluster._start_daemons()
        cluster.wait_idle(START_TIMEOUT_S)
        cluster._wait_scheduler(START_TIMEOUT_S)
    except BaseException:
        cluster.teardown()
        raise
    cluster.bring_up_s = time.monotonic() - started
    return cluster
