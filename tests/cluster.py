"""A real multi-host cluster on this machine: a bridge, one network namespace and sshd per host."""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import pwd
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Collection, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tests import cluster_files as files
from tests.cluster_sys import (
    NEIGH_FROM_HOSTS,
    NETNS_ETC,
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
    raise_neigh_limits,
    read_pid,
    reap_stale_clusters,
    registry_lock,
    release_neigh_limits,
    remove_network,
    run,
    run_all,
    start_time,
    unavailable_reason,
    wait_until,
    which,
)
from tests.required import missing

__all__ = ["Cluster", "ClusterError", "ClusterHost", "leftovers", "start_cluster",
           "unavailable_reason"]

MAX_PREFIX_LEN = 10  # "<prefix>-v244" must fit Linux's 15-character interface names
MAX_HOSTS = 244  # host i has address .(10+i) of the cluster's /24
# Runs argv under a fresh UTS namespace with the host's hostname ($1); argv is never a string.
_HOSTNAME_EXEC = 'hostname "$1" && shift && exec "$@"'
# A host without a shared filesystem: in its own mount namespace, a fresh tmpfs over /srv that
# holds root's home ($4: the host's own passwd says so) and the test user's ($2, owned by uid $3);
# then as _HOSTNAME_EXEC. /root stays shared: this machine's Python may live there (pyenv).
_PRIVATE_EXEC = ('mount -t tmpfs -o mode=0755 ddpctl-srv /srv && mkdir -m 0700 "$4" && '
                 'mkdir -p "$2" && chown "$3:$3" "$2" && hostname "$1" && shift 4 && exec "$@"')
TEST_USER = "ddpuser"
TEST_HOME = f"/srv/home/{TEST_USER}"
ROOT_HOME = "/srv/root"  # root's home on a private host


@dataclass(frozen=True)
class ClusterHost:
    """One host of the cluster: inventory name, address, namespace and its sshd files."""

    name: str
    address: str
    netns: str
    veth: str  # the bridge-side end; `eth0` is the end inside the namespace
    sshd_pid_file: Path
    sshd_config: Path
    sshd_log: Path
    # Its own mount namespace: /srv is a private tmpfs, seen by no other host nor by this machine,
    # holding root's home (ROOT_HOME) and the test user's (TEST_USER, home TEST_HOME).
    private: bool = False
    password_login: bool = False  # the test user may log in with its password


@dataclass
class Cluster:
    """A running cluster; `teardown()` (or leaving `with`) removes every trace of it."""

    prefix: str
    workdir: Path
    network: ipaddress.IPv4Network
    hosts: list[ClusterHost]
    port: int = 22
    test_password: str = field(default_factory=lambda: f"pw {secrets.token_hex(8)} $;'\"")
    test_uid: int = 0
    _hostnames: list[str] = field(default_factory=list)
    # hosts whose hostname /etc/hosts leaves out: every host's unless start_cluster's `resolvable`
    # lists it (bare-metal and cloud hosts with DHCP names are so; a test that needs a name to
    # resolve says so)
    _unlisted: set[int] = field(default_factory=set)
    _auth_files: list[Path] = field(default_factory=list)
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list)
    _torn_down: bool = False

    # -- paths and names ------------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def bridge_address(self) -> str:
        """The control host's address on the bridge (hosts reach this machine here)."""
        return str(self.network.network_address + 1)

    @property
    def key(self) -> Path:
        return self.workdir / "id_ed25519"

    @property
    def host_key(self) -> Path:
        return self.workdir / "ssh_host_ed25519_key"

    @property
    def authorized_keys(self) -> Path:
        return self.workdir / "authorized_keys"

    @property
    def known_hosts(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.workdir / "ssh_config"

    @property
    def hosts_toml(self) -> Path:
        return self.workdir / "hosts.toml"

    def hostname(self, i: int) -> str:
        """The hostname host `i` reports (its inventory name unless `set_hostname` changed it)."""
        return self._hostnames[i]

    @property
    def test_user(self) -> str:
        return TEST_USER

    @property
    def test_home(self) -> str:
        return TEST_HOME

    @property
    def root_home(self) -> str:
        """root's home on a private host (elsewhere: /root, this machine's)."""
        return ROOT_HOME

    def ssh_argv(self, i: int, *remote: str) -> list[str]:
        """OpenSSH client argv that runs `remote` on host `i` (remote words are joined by ssh)."""
        return ["ssh", "-F", str(self.ssh_config), self.hosts[i].name, *remote]

    # -- life cycle -------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.teardown()

    def _create_network(self) -> None:
        lines = [f"link add {self.bridge} type bridge",
                 f"addr add {self.bridge_address}/{self.network.prefixlen} dev {self.bridge}",
                 f"link set {self.bridge} up"]
        for h in self.hosts:
            lines += [f"netns add {h.netns}",
                      f"link add {h.veth} type veth peer name eth0 netns {h.netns}",
                      f"link set {h.veth} master {self.bridge} up"]
        ip_batch(lines)
        inner = [["link set lo up", f"addr add {h.address}/{self.network.prefixlen} dev eth0",
                  "link set eth0 up"] for h in self.hosts]
        run_all([["ip", "-n", h.netns, "-batch", "-"] for h in self.hosts],
                 ["\n".join(cmds) + "\n" for cmds in inner])

    def _write_files(self) -> None:
        files.make_keys(self.key, self.host_key)
        self.authorized_keys.write_text(self.key.with_suffix(".pub").read_text())
        host_pub = self.host_key.with_suffix(".pub").read_text().split()
        files.write_known_hosts(self.known_hosts, [h.address for h in self.hosts], self.port,
                                host_pub)
        files.write_ssh_config(self.ssh_config, [(h.name, h.address) for h in self.hosts],
                               self.port, self.key, self.known_hosts)
        files.write_hosts_toml(self.hosts_toml, [(h.name, h.address) for h in self.hosts],
                               sys.executable)
        self._write_name_resolution()
        for h in self.hosts:
            if h.private:
                files.write_user_db(NETNS_ETC / h.netns, TEST_USER, self.test_uid, TEST_HOME,
                                    self.test_password, ROOT_HOME)

    def _write_name_resolution(self) -> None:
        """Each host resolves the names of the hosts `resolvable` lists (by default none, its own
        included: c10d, gloo and torchrun --standalone look a host's own name up, and a test
        cluster that made every name resolve hid it): `ip netns exec` bind-mounts
        /etc/netns/<ns>/* over /etc/*. DNS goes to the namespace's own loopback, where nothing
        answers: an unknown name fails at once, and no query leaves the namespace."""
        table = "127.0.0.1 localhost\n::1 localhost\n" + "".join(
            f"{h.address} {self._hostnames[i]}\n" for i, h in enumerate(self.hosts) if i not in self._unlisted)
        for h in self.hosts:
            etc = NETNS_ETC / h.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(table)
            (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def _sshd_argv(self, i: int) -> list[str]:
        h = self.hosts[i]
        files.write_sshd_config(h.sshd_config, h.address, self.port, self.host_key,
                                h.sshd_pid_file, self._auth_files[i],
                                TEST_USER if h.private else None, h.password_login)
        h.sshd_pid_file.unlink(missing_ok=True)
        sshd = [str(which("sshd")), "-f", str(h.sshd_config), "-E", str(h.sshd_log)]
        if h.private:
            return ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--mount",
                    "--propagation", "private", "sh", "-c", _PRIVATE_EXEC, "sh",
                    self._hostnames[i], TEST_HOME, str(self.test_uid), ROOT_HOME, *sshd]
        return ["ip", "netns", "exec", h.netns, "unshare", "--uts", "sh", "-c", _HOSTNAME_EXEC,
                "sh", self._hostnames[i], *sshd]

    def _start_sshds(self, indices: Sequence[int]) -> None:
        run_all([self._sshd_argv(i) for i in indices], [None] * len(indices))
        for i in indices:
            h = self.hosts[i]
            try:
                wait_until(lambda h=h: self._sshd_pid(h) is not None, START_TIMEOUT_S,
                           f"sshd of {h.name} to write {h.sshd_pid_file}")
            except ClusterError as err:
                log = h.sshd_log.read_text()[-2000:] if h.sshd_log.exists() else ""
                raise ClusterError(f"{err}; sshd log {h.sshd_log}:\n{log}") from None

    def _sshd_pid(self, h: ClusterHost) -> int | None:
        pid = read_pid(h.sshd_pid_file)
        return pid if pid is not None and pid_alive(pid) else None

    def sshd_pid(self, i: int) -> int:
        """Host `i`'s running sshd."""
        pid = self._sshd_pid(self.hosts[i])
        if pid is None:
            raise ClusterError(f"{self.hosts[i].name} has no sshd running")
        return pid

    def teardown(self) -> None:
        """Kill every process of every host, delete namespaces, veths and bridge, then verify."""
        if self._torn_down:
            return
        self._torn_down = True
        _LIVE.pop(id(self), None)
        for proc in self._procs:
            if proc.poll() is None:
                kill(proc.pid, signal.SIGKILL)
        for h in self.hosts:
            pid = self._sshd_pid(h)
            if pid is not None:
                kill(pid, signal.SIGKILL)
        try:
            kill_netns([h.netns for h in self.hosts])
        finally:  # even if a process would not die: the network goes, the record stays no more
            for proc in self._procs:
                with suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            remove_network(self.bridge, [h.veth for h in self.hosts],
                           [h.netns for h in self.hosts])
            with registry_lock():
                (REGISTRY / f"{self.prefix}.json").unlink(missing_ok=True)
                release_neigh_limits()  # the last cluster that raised them puts them back
        left = leftovers(self.prefix)
        if left:
            raise ClusterError(f"teardown of cluster {self.prefix} left {', '.join(left)}")

    # -- faults and probes ------------------------------------------------------------------
    def _stop_sshd(self, i: int, sig: int = signal.SIGTERM) -> None:
        h = self.hosts[i]
        pid = self._sshd_pid(h)
        if pid is not None:
            kill(pid, sig)
            wait_until(lambda: not pid_alive(pid), 10.0, f"sshd {pid} of {h.name} to exit")
        h.sshd_pid_file.unlink(missing_ok=True)

    def stop_sshd(self, i: int) -> None:
        """Stop host `i`'s sshd (new connections are refused; open sessions carry on)."""
        self._stop_sshd(i)

    def start_sshd(self, i: int) -> None:
        """(Re)start host `i`'s sshd with its current hostname and authorized keys (a private
        host comes back with empty private directories, as after a reboot)."""
        self._stop_sshd(i)
        self._start_sshds([i])

    def set_hostname(self, i: int, name: str) -> None:
        """Give host `i` a new hostname (its sshd restarts in a fresh UTS namespace)."""
        self._hostnames[i] = name
        self._write_name_resolution()
        self.start_sshd(i)

    def unlist_hostname(self, i: int, name: str) -> None:
        """Give host `i` the hostname `name` that no host (itself included) can resolve."""
        self._unlisted.add(i)
        self.set_hostname(i, name)

    def resolves(self, i: int) -> bool:
        """Whether the hosts resolve host `i`'s hostname (start_cluster's `resolvable`)."""
        return i not in self._unlisted

    def unauthorize_key(self, i: int) -> None:
        """Make host `i` refuse the cluster key: an empty AuthorizedKeysFile, sshd restarted."""
        empty = self.workdir / f"authorized_keys.{self.hosts[i].name}.empty"
        empty.write_text("")
        self._auth_files[i] = empty
        self.start_sshd(i)

    def authorize_key(self, i: int) -> None:
        """Undo `unauthorize_key`: host `i` accepts the cluster key again."""
        self._auth_files[i] = self.authorized_keys
        self.start_sshd(i)

    def link_down(self, i: int) -> None:
        """Unplug host `i`: its bridge-side veth goes down (packets vanish, connects time out)."""
        run(["ip", "link", "set", self.hosts[i].veth, "down"])

    def link_up(self, i: int) -> None:
        """Plug host `i` back in (undo `link_down`)."""
        run(["ip", "link", "set", self.hosts[i].veth, "up"])

    def _ns_argv(self, i: int, argv: Sequence[str]) -> list[str]:
        h = self.hosts[i]
        if h.private:  # join the namespaces of its sshd: its network, hostname and mounts
            pid = self._sshd_pid(h)
            if pid is None:
                raise ClusterError(f"{h.name} has no sshd running: its private mounts are gone")
            return ["nsenter", "-t", str(pid), "-m", "-u", "-n", "--", *argv]
        return ["ip", "netns", "exec", self.hosts[i].netns, "unshare", "--uts", "sh", "-c",
                _HOSTNAME_EXEC, "sh", self._hostnames[i], *argv]

    def iptables(self, i: int, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `iptables ARGS` inside host `i` (e.g. "-I", "INPUT", ..., "-j", "DROP")."""
        return run(["ip", "netns", "exec", self.hosts[i].netns, "iptables", *args])

    def add_dummy_interface(self, i: int, name: str, cidr: str) -> None:
        """Add an up decoy interface `name` with address `cidr` inside host `i`.

        A `dummy` link where the kernel has the driver, else (this VM's kernel has none) one
        end of a veth pair whose other end, `p<name>`, also stays inside the host.
        """
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,14}", name):
            raise ClusterError(f"interface name {name!r}: use 1-14 letters, digits, _ . -")
        try:
            ipaddress.ip_interface(cidr)
        except ValueError as err:
            raise ClusterError(f"interface address {cidr!r}: {err} (e.g. 172.17.0.1/16)") from None
        netns = self.hosts[i].netns
        try:
            ip_batch([f"link add {name} type dummy"], netns=netns)
        except ClusterError as err:
            if "Unknown device type" not in str(err):
                raise
            peer = f"p{name}"
            ip_batch([f"link add {name} type veth peer name {peer}", f"link set {peer} up"],
                     netns=netns)
        ip_batch([f"addr add {cidr} dev {name}", f"link set {name} up"], netns=netns)

    def exec_in(self, i: int, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start argv inside host `i` (network and hostname); killed at teardown at the latest."""
        proc = subprocess.Popen(self._ns_argv(i, argv), **popen_kwargs)
        self._procs.append(proc)
        return proc

    def run_in(self, i: int, argv: Sequence[str], timeout: float = 60.0,
               **run_kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run argv inside host `i` to completion; output captured as text, no check."""
        kwargs: dict[str, Any] = {"capture_output": True, "text": True, **run_kwargs}
        return subprocess.run(self._ns_argv(i, argv), timeout=timeout, **kwargs)

    def pids(self, i: int) -> list[int]:
        """Every live pid inside host `i`'s namespace (its sshd included)."""
        return netns_pids(self.hosts[i].netns)

    def job_pids(self, i: int, job_id: str) -> list[int]:
        """Pids inside host `i` whose environment holds DDPCTL_JOB_ID=<job_id>."""
        needle = f"DDPCTL_JOB_ID={job_id}".encode()
        found = []
        for pid in self.pids(i):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if needle in environ:
                found.append(pid)
        return found


_LIVE: dict[int, Cluster] = {}


@atexit.register
def _teardown_live() -> None:
    for cluster in list(_LIVE.values()):
        try:
            cluster.teardown()
        except ClusterError as err:
            print(f"warning: {err}", file=sys.stderr)

def _free_uid() -> int:
    """A uid (and gid) that no user or group of this machine has."""
    taken = {u.pw_uid for u in pwd.getpwall()} | {u.pw_gid for u in pwd.getpwall()}
    return next(uid for uid in range(61000, 65000) if uid not in taken)


def _plan(prefix: str, workdir: Path, n: int, network: ipaddress.IPv4Network,
          port: int, private: Collection[int], password_login: Collection[int],
          resolvable: Collection[int]) -> Cluster:
    hosts = [
        ClusterHost(name=f"node{i}", address=str(network.network_address + 10 + i),
                    netns=f"{prefix}-n{i}", veth=f"{prefix}-v{i}",
                    sshd_pid_file=workdir / f"sshd.node{i}.pid",
                    sshd_config=workdir / f"sshd_config.node{i}",
                    sshd_log=workdir / f"sshd.node{i}.log",
                    private=i in private, password_login=i in password_login)
        for i in range(n)
    ]
    cluster = Cluster(prefix=prefix, workdir=workdir, network=network, hosts=hosts, port=port,
                      test_uid=_free_uid() if private else 0)
    cluster._hostnames = [h.name for h in hosts]
    cluster._unlisted = set(range(n)) - set(resolvable)
    cluster._auth_files = [cluster.authorized_keys] * n
    return cluster


def _register(cluster: Cluster) -> None:
    record = {"prefix": cluster.prefix, "owner": os.getpid(),
              "owner_start": start_time(os.getpid()), "bridge": cluster.bridge,
              "netns": [h.netns for h in cluster.hosts], "veths": [h.veth for h in cluster.hosts],
              "pid_files": [str(h.sshd_pid_file) for h in cluster.hosts],
              "neigh": len(cluster.hosts) >= NEIGH_FROM_HOSTS}  # it raises the ARP limits
    (REGISTRY / f"{cluster.prefix}.json").write_text(json.dumps(record))
    _LIVE[id(cluster)] = cluster


def _check_request(n: int, prefix: str, port: int, private: Collection[int],
                   password_login: Collection[int], resolvable: Collection[int]) -> None:
    if not 1 <= n <= MAX_HOSTS:
        raise ClusterError(f"start_cluster(n={n}): n must be between 1 and {MAX_HOSTS}")
    if not set(resolvable) <= set(range(n)):
        raise ClusterError(f"resolvable={sorted(resolvable)}: hosts are 0..{n - 1}")
    if not set(private) <= set(range(n)):
        raise ClusterError(f"private={sorted(private)}: hosts are 0..{n - 1}")
    if not set(password_login) <= set(private):
        raise ClusterError(f"password_login={sorted(password_login)}: only private hosts "
                           f"(private={sorted(private)}) have the test user")
    if not (prefix.isascii() and prefix.isalnum() and len(prefix) <= MAX_PREFIX_LEN):
        raise ClusterError(f"prefix {prefix!r}: use at most {MAX_PREFIX_LEN} letters/digits")
    if not 1 <= port <= 65535:
        raise ClusterError(f"port {port}: must be 1..65535")
    if leftovers(prefix):
        raise ClusterError(f"prefix {prefix!r} is in use: {', '.join(leftovers(prefix))}")


def require_cluster() -> None:
    """For tests: skip when no cluster can be built here; fail instead under DDPCTL_REQUIRE_CLUSTER=1."""
    reason = unavailable_reason()
    if reason is not None:
        missing(reason)


def start_cluster(n: int, workdir: Path, prefix: str | None = None, port: int = 22,
                  private: bool | Collection[int] = False,
                  password_login: Collection[int] = (),
                  resolvable: bool | Collection[int] = ()) -> Cluster:
    """Bring up `n` hosts node0..node{n-1}, each with its own namespace, address and sshd.

    The hosts' names resolve nowhere, as on bare-metal and cloud hosts with DHCP names: no host
    (itself included) finds `nodeI` in its /etc/hosts or DNS; the inventory reaches each host by
    address. `resolvable` (True: all, or host indices) writes those hosts' names into every host's
    /etc/hosts, for a test about a cluster whose names resolve.

    By default the hosts share this machine's filesystem (an NFS cluster). `private` (True: all,
    or host indices) gives hosts their own mount namespace instead: /srv is a fresh tmpfs that
    holds root's home there (/srv/root: its ~/.ssh/authorized_keys counts, besides the cluster
    key) and the test user `ddpuser`'s (/srv/home/ddpuser, no key authorized);
    `password_login` (indices of private hosts) lets both log in with `cluster.test_password`.

    Writes hosts.toml, ssh_config, known_hosts and the key pair into `workdir`. Use it as a
    context manager (`with start_cluster(2, d) as c:`) or call `teardown()`; an atexit hook
    and a per-cluster record under /run/ddpctl-cluster reap it if its owner dies.

    Trap: the kernel's neighbour (ARP) table is one table for every network namespace, 1,024
    entries by default (net.ipv4.neigh.default.gc_thresh3), and all-pairs traffic among n hosts
    needs about (n+1)² of them: from about 32 hosts the kernel logs `neighbour: arp_cache:
    neighbor table overflow!` and drops packets, which looks exactly like a firewall. So a
    cluster of more than 8 hosts raises gc_thresh1..3 to fit every registered cluster
    (cluster_sys.neigh_targets; never lowering one), saving the values it found in
    /run/ddpctl-cluster/neigh-limits; the teardown (or the reaper) of the last such cluster
    puts them back.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise ClusterError(reason)
    prefix = prefix or f"dd{secrets.token_hex(2)}"
    private = set(range(n)) if private is True else set(private or ())
    resolvable = set(range(n)) if resolvable is True else set(resolvable or ())
    _check_request(n, prefix, port, private, password_login, resolvable)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    with registry_lock():
        reap_stale_clusters()
        cluster = _plan(prefix, workdir, n, pick_network(), port, private, set(password_login), resolvable)
        _register(cluster)
        try:
            if n >= NEIGH_FROM_HOSTS:
                raise_neigh_limits()
            cluster._create_network()
        except BaseException:
            cluster.teardown()
            raise
    try:
        cluster._write_files()
        cluster._start_sshds(range(n))
    except BaseException:
        cluster.teardown()
        raise
    return cluster
