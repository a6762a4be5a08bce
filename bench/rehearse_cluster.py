"""Bring a namespace cluster up by hand, print how to reach it, tear it down on Enter/Ctrl-C."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.cluster import Cluster, ClusterError, leftovers, start_cluster  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", "--hosts", type=int, default=2, help="number of hosts (default 2)")
    parser.add_argument("--workdir", type=Path, help="where keys and configs go (default: temp)")
    parser.add_argument("--prefix", help="name prefix, at most 10 letters/digits (default: random)")
    parser.add_argument("--no-wait", action="store_true",
                        help="tear down right after bring-up (prints the timings)")
    return parser.parse_args(argv)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def describe(cluster: Cluster, up_s: float) -> str:
    """How to reach the cluster: its hosts, files and ready-to-paste commands."""
    first, last = cluster.hosts[0], cluster.hosts[-1]
    lines = [f"cluster {cluster.prefix}: {len(cluster.hosts)} hosts on {cluster.network} "
             f"(this machine is {cluster.bridge_address} on bridge {cluster.bridge}), "
             f"up in {up_s:.2f} s"]
    lines += [f"  {h.name:<7} {h.address:<15} netns {h.netns}" for h in cluster.hosts]
    lines += [
        f"inventory      {cluster.hosts_toml}",
        f"ssh            ssh -F {cluster.ssh_config} {first.name}",
        f"key            {cluster.key}   known_hosts {cluster.known_hosts}",
        f"shell inside   ip netns exec {first.netns} bash",
        f"pdsh           PDSH_RCMD_TYPE=ssh PDSH_SSH_ARGS_APPEND='-F {cluster.ssh_config}' "
        f"pdsh -w node[0-{len(cluster.hosts) - 1}] hostname",
        "gloo           hostnames do not resolve: use addresses and GLOO_SOCKET_IFNAME=eth0",
        f"sshd logs      {first.sshd_log.parent}/sshd.node0.log … {last.sshd_log.name}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ddpctl-cluster-"))
    started = time.monotonic()
    try:
        cluster = start_cluster(args.hosts, workdir, prefix=args.prefix)
    except ClusterError as err:
        print(f"error: cannot bring the cluster up: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted during bring-up; torn down", file=sys.stderr)
        return 130
    with cluster:
        print(describe(cluster, time.monotonic() - started), flush=True)
        if not args.no_wait:
            try:
                input("\nPress Enter (or Ctrl-C) to tear the cluster down... ")
            except (KeyboardInterrupt, EOFError):
                print()
        stopping = time.monotonic()
    print(f"torn down in {time.monotonic() - stopping:.2f} s; "
          f"left behind: {', '.join(leftovers(cluster.prefix)) or 'nothing'}")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
