"""Process, namespace and `ip` plumbing under the namespace cluster of tests/cluster.py."""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path
from typing import Any

REGISTRY = Path("/run/ddpctl-cluster")  # one JSON record per live cluster, for stale reaping
NETWORK = ipaddress.ip_network("198.18.0.0/15")
START_TIMEOUT_S = 20.0
SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"


class ClusterError(RuntimeError):
    """The cluster could not be built, changed or torn down; the message says what and why."""


def which(tool: str) -> str | None:
    """Find a tool on PATH or in the sbin directories (root's tools live there)."""
    for directory in os.environ.get("PATH", "").split(os.pathsep) + SBIN_PATH.split(":"):
        candidate = Path(directory or ".") / tool
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@cache
def unavailable_reason() -> str | None:
    """Why a cluster cannot be built here (None: it can). Cheap: one `unshare` probe."""
    if os.geteuid() != 0:
        return "the namespace cluster needs root (network namespaces, sshd); run pytest as root"
    missing = [t for t in ("sshd", "ssh", "ssh-keygen", "ip", "unshare") if which(t) is None]
    if missing:
        return (
            f"the namespace cluster needs {', '.join(missing)}: "
            "apt-get install -y openssh-server openssh-client iproute2 util-linux"
        )
    probe = subprocess.run(
        [str(which("unshare")), "--net", "--uts", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"cannot create network namespaces here: {probe.stderr.strip()}"
    return None


def run(argv: Sequence[str], stdin: str | None = None, check: bool = True,
         timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run argv with text output captured; ClusterError naming the command if it fails."""
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def ip_batch(lines: Sequence[str], netns: str | None = None, force: bool = False) -> None:
    """Feed `ip -batch` (inside `netns` if given); `force` carries on past errors, unchecked."""
    argv = ["ip"] + (["-n", netns] if netns else []) + (["-force"] if force else [])
    run([*argv, "-batch", "-"], stdin="\n".join(lines) + "\n", check=not force)


def run_all(argvs: Sequence[Sequence[str]], stdins: Sequence[str | None]) -> None:
    """Run commands concurrently (they are short); raise for the first one that failed."""
    procs = [
        subprocess.Popen(list(a), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
        for a in argvs
    ]
    errors = []
    for argv, proc, stdin in zip(argvs, procs, stdins, strict=True):
        _, err = proc.communicate(stdin, timeout=START_TIMEOUT_S)
        if proc.returncode != 0:
            errors.append(f"`{' '.join(argv)}` exited {proc.returncode}: {err.strip()}")
    if errors:
        raise ClusterError("; ".join(errors))


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `pred` with a growing delay until it holds; ClusterError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while not pred():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def proc_stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def pid_alive(pid: int) -> bool:
    """True if `pid` runs and is not a zombie (PID 1 here may never reap daemons' zombies)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def start_time(pid: int) -> str | None:
    stat = proc_stat(pid)
    return stat[19] if stat is not None else None


def netns_pids(netns: str) -> list[int]:
    """Pids living in a named namespace: what `ip netns pids` prints, without the fork."""
    return all_netns_pids([netns])[netns]


def all_netns_pids(namespaces: Sequence[str]) -> dict[str, list[int]]:
    """Live pids of each named namespace, found in one pass over /proc."""
    wanted: dict[tuple[int, int], str] = {}
    for netns in namespaces:
        with suppress(OSError):
            st = os.stat(f"/run/netns/{netns}")
            wanted[(st.st_ino, st.st_dev)] = netns
    found: dict[str, list[int]] = {netns: [] for netns in namespaces}
    for entry in os.listdir("/proc") if wanted else []:
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        netns = wanted.get((st.st_ino, st.st_dev))
        if netns is not None and pid_alive(int(entry)):
            found[netns].append(int(entry))
    return found


def kill(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def kill_netns(namespaces: Sequence[str]) -> None:
    """SIGKILL everything in the namespaces until nothing is left (forks can race a pass)."""
    def empty() -> bool:
        pids = [pid for found in all_netns_pids(namespaces).values() for pid in found]
        for pid in pids:
            kill(pid, signal.SIGKILL)
        return not pids

    wait_until(empty, 10.0, f"the processes of namespaces {', '.join(namespaces)} to die")


NETNS_ETC = Path("/etc/netns")  # ip netns exec bind-mounts <this>/<ns>/* over /etc/*


def remove_network(bridge: str, veths: Sequence[str], namespaces: Sequence[str]) -> None:
    """Delete veths (their namespace ends go with them), namespaces and bridge; missing is ok."""
    lines = [f"link del {v}" for v in veths] + [f"netns del {n}" for n in namespaces]
    ip_batch([*lines, f"link del {bridge}"], force=True)
    for n in namespaces:  # the per-host /etc overlay (hosts file) that `ip netns exec` mounts
        shutil.rmtree(NETNS_ETC / n, ignore_errors=True)


def leftovers(prefix: str) -> list[str]:
    """Namespaces and links whose name starts with `prefix-` (empty after a clean teardown)."""
    spaces = run(["ip", "netns", "list"]).stdout.split("\n")
    links = run(["ip", "-o", "link", "show"]).stdout.split("\n")
    found = [f"netns {line.split()[0]}" for line in spaces if line.startswith(f"{prefix}-")]
    for line in links:
        parts = line.split(":")
        if len(parts) > 1 and parts[1].strip().split("@")[0].startswith(f"{prefix}-"):
            found.append(f"link {parts[1].strip().split('@')[0]}")
    return found


_THREAD_LOCK = threading.RLock()
_lock_depth = 0  # how deep this process is inside registry_lock (the flock is taken once)


@contextmanager
def registry_lock() -> Iterator[None]:
    """Serialise subnet picking, registering, reaping and the ARP limits across processes building
    or tearing down clusters at once. Reentrant within a process (a failed start tears down under it)."""
    global _lock_depth
    with _THREAD_LOCK:
        if _lock_depth:
            _lock_depth += 1
            try:
                yield
            finally:
                _lock_depth -= 1
            return
        REGISTRY.mkdir(parents=True, exist_ok=True)
        with open(REGISTRY / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _lock_depth = 1
            try:
                yield
            finally:
                _lock_depth = 0


def cluster_records(registry: Path = REGISTRY) -> list[tuple[Path, dict[str, Any]]]:
    """The registered clusters: each record file and its JSON (unreadable ones left out)."""
    records = []
    for record_file in sorted(registry.glob("*.json")):
        try:
            records.append((record_file, json.loads(record_file.read_text())))
        except (OSError, ValueError):
            continue
    return records


# -- the kernel's neighbour (ARP) table: one for all network namespaces -----------------------
NEIGH = Path("/proc/sys/net/ipv4/neigh/default")
NEIGH_KEYS = ("gc_thresh1", "gc_thresh2", "gc_thresh3")  # raised in reverse order, lowered in this
NEIGH_SAVED = REGISTRY / "neigh-limits"  # not *.json: the reaper reads those as cluster records
NEIGH_FROM_HOSTS = 9  # smaller clusters fit the default limits and leave them alone


def neigh_limits() -> dict[str, int]:
    """The current gc_thresh1..3 of net.ipv4.neigh.default."""
    return {k: int((NEIGH / k).read_text()) for k in NEIGH_KEYS}


def neigh_targets(sizes: Sequence[int]) -> dict[str, int]:
    """Limits that fit clusters of these sizes up at once: all-pairs traffic among n hosts and this
    machine needs about (n+1)² entries; gc_thresh3 (the hard cap) is 4x that, thresh2 (where the
    periodic GC starts) half of it, thresh1 (below which nothing is collected) a quarter."""
    need = 4 * sum((n + 1) ** 2 for n in sizes)
    return {"gc_thresh1": need // 4, "gc_thresh2": need // 2, "gc_thresh3": need}


def _write_neigh(values: dict[str, int], keys: Sequence[str]) -> None:
    for k in keys:
        if k in values:
            try:
                (NEIGH / k).write_text(str(values[k]))
            except OSError as err:
                raise ClusterError(f"cannot set net.ipv4.neigh.default.{k} = {values[k]}: {err} "
                                   f"(run as root in the initial network namespace)") from None


def raise_neigh_limits() -> None:
    """Under registry_lock, once registered: raise the limits to fit every registered cluster at
    once, never lowering one. The values found before the first raise go to NEIGH_SAVED (with the
    values set), for release_neigh_limits."""
    current = neigh_limits()
    sizes = [len(record["netns"]) for _, record in cluster_records()]
    wanted = {k: max(current[k], v) for k, v in neigh_targets(sizes).items()}
    if wanted == current:
        return
    try:
        original = json.loads(NEIGH_SAVED.read_text())["original"]
    except (OSError, ValueError, KeyError):
        original = current
    NEIGH_SAVED.write_text(json.dumps({"original": original, "set": wanted}))
    _write_neigh(wanted, NEIGH_KEYS[::-1])


def release_neigh_limits() -> None:
    """Under registry_lock: once no registered cluster asks for raised limits ("neigh" in its
    record), put back the values saved before the first raise: those still at the value set (one
    changed meanwhile by someone else is theirs)."""
    try:
        saved = json.loads(NEIGH_SAVED.read_text())
    except OSError:
        return
    except ValueError:
        saved = None
    if any(record.get("neigh") for _, record in cluster_records()):
        return
    if saved is not None:
        current = neigh_limits()
        _write_neigh({k: v for k, v in saved["original"].items() if current.get(k) == saved["set"].get(k)},
                     NEIGH_KEYS)
    NEIGH_SAVED.unlink(missing_ok=True)


def reap_stale_clusters(registry: Path = REGISTRY,
                        also: Callable[[dict[str, Any]], None] | None = None) -> list[str]:
    """Tear down clusters whose owning process died without cleaning up; return their prefixes.
    Their daemons live in their namespaces, so killing the namespaces' processes stops them all;
    `also` cleans up what else a kind of cluster leaves (a Slurm cluster's cgroups). Then the ARP
    limits go back if no cluster that raised them is left."""
    reaped = []
    with registry_lock():
        for record_file, record in cluster_records(registry):
            if start_time(record["owner"]) == record["owner_start"]:
                continue
            kill_netns(record["netns"])
            remove_network(record["bridge"], record["veths"], record["netns"])
            if also is not None:
                also(record)
            record_file.unlink(missing_ok=True)
            reaped.append(record["prefix"])
        release_neigh_limits()  # a dead owner's raised ARP limits go back too
    return reaped


def pick_network() -> ipaddress.IPv4Network:
    """A random /24 of 198.18.0.0/15 that no interface of this machine uses yet."""
    in_use = []
    for line in run(["ip", "-o", "-4", "addr", "show"]).stdout.splitlines():
        in_use.append(ipaddress.ip_interface(line.split()[3]).network)
    candidates = list(NETWORK.subnets(new_prefix=24))
    start = secrets.randbelow(len(candidates))
    for k in range(len(candidates)):
        net = candidates[(start + k) % len(candidates)]
        if net.network_address.packed[2] != 0 and not any(net.overlaps(u) for u in in_use):
            return net  # x.x.0.0/24 is left to hand-made clusters such as the recipe's
    raise ClusterError("no free /24 left in 198.18.0.0/15: tear down stale clusters")

