"""What one agent call costs, this tree beside another (default: the tree before the agent cache),
in one run: the bytes a call sends a host (the command line and stdin), the host's CPU per call,
and on a namespace cluster `ddpctl doctor` ÷ `pdsh -R ssh … true` at --sizes hosts.

Per call (on this machine, no cluster): each tree's own interpreter runs its agent `--calls` times
for `ping` and for doctor's `facts` op (a worker's: no script, no probe), the host's cache warm
(the call before wrote it); a cold call's bytes add the sources a host without them asks for. The bytes are
what the control plane writes: argv (the bootstrap rides on it) + stdin (the key or the
sources, the request, and the sources again where the host asked for them). The CPU is the agent
process's (user + system, RUSAGE_CHILDREN), median over the calls.

On the cluster (--sizes, default 16 32; --no-cluster skips it): each size --repeat rounds of
pdsh, doctor (this tree) and doctor (the other), the order turning each round; the medians and
the median per-run ratio. Then at --up-sizes, --up-rounds rounds of `ddpctl up` of the toy job
(each tree's) and the manual recipe (bench/launch_teardown.py). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.breakdown import host_python, user_env  # noqa: E402
from bench.doctor_fanout import pdsh_argv, timed, write_inventory  # noqa: E402
from bench.jobwatch import DDPCTL_HELP, Ddpctl  # noqa: E402
from tests.cluster import start_cluster  # noqa: E402

BEFORE = "6656d3f"  # the last commit before the agent was cached by its key

# Runs in the measured tree's interpreter (its tree first on the path): prints one JSON object.
PER_CALL = r"""
import json, os, resource, statistics, subprocess, sys
from dataclasses import replace
from inventory import LOCALHOST
from orchestrator.remote import agent as a
from orchestrator.remote.transport import LocalTransport
calls = int(sys.argv[1])
facts = {"python": sys.executable, "workdir": "/tmp", "master_addr": "127.0.0.1", "master_port": 29500,
         "check_port": False, "env_names": [], "env_prefixes": ["NCCL_"]}
keyed = getattr(a, "keyed_request", None)  # absent before the cache by key: every call sends all
t = LocalTransport(replace(LOCALHOST, python=sys.executable))
argv = a.agent_argv(sys.executable)
argv_bytes = sum(len(x.encode()) + 1 for x in argv)

def cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

out = {}
for op, request in (("ping", {}), ("facts", facts)):
    a.call_agent(t, op, request)  # the host's cache written
    stdin = (keyed or a.request_bytes)(op, request)
    spent = []
    for _ in range(calls):
        before = cpu()
        proc = subprocess.run(argv, input=stdin, capture_output=True, check=True)
        spent.append(cpu() - before)
        assert b"@@DDPCTL-RESULT@@" in proc.stdout, proc.stdout[-500:] + proc.stderr[-500:]
    cold = stdin + (a.code_bytes() if keyed else b"")  # a host without it asks for the sources
    out[op] = {"warm_bytes": argv_bytes + len(stdin), "cold_bytes": argv_bytes + len(cold),
               "argv_bytes": argv_bytes, "warm_cpu_ms": 1000 * statistics.median(spent)}
print(json.dumps(out))
"""


def per_call(ddpctl: Ddpctl, calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="agent-cache-") as cache:
        env = {**ddpctl.env(), "XDG_CACHE_HOME": cache}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        proc = subprocess.run([sys.executable, "-c", PER_CALL, str(calls)], capture_output=True,
                              text=True, cwd=ddpctl.tree, env=env, check=False)
        if proc.returncode:
            raise SystemExit(f"{ddpctl.label}: {proc.stderr[-2000:]}")
        figures: dict[str, Any] = json.loads(proc.stdout)
        return figures


def cluster_rounds(trees: dict[str, Ddpctl], sizes: list[int], repeat: int, tmp: Path) -> None:
    python = host_python(tmp / "host-python")
    with start_cluster(max(sizes), tmp / "cluster", private=True) as cluster:
        pdsh_env = {**user_env(), "PDSH_SSH_ARGS_APPEND": f"-F {cluster.ssh_config}"}
        print(f"\n{'hosts':>5}  {'pdsh':>7}  " + "  ".join(f"{n + ' doctor':>16}  {'÷ pdsh':>7}" for n in trees)
              + "   (medians of the runs; the ratio: median per-run doctor ÷ pdsh)")
        for n in sizes:
            inventory = write_inventory(cluster, n, tmp / f"hosts{n}.toml", python)
            argv = {name: [sys.executable, "-P", "-m", "orchestrator", "doctor", "-i", str(inventory),
                           "--ssh-config", str(cluster.ssh_config), "--json"] for name in trees}
            envs = {name: {**user_env(), "PYTHONPATH": str(d.tree)} for name, d in trees.items()}
            for name in reversed(list(trees)):  # warm: torch facts and each tree's agent cached
                timed(argv[name], envs[name])
            walls: dict[str, list[float]] = {"pdsh": [], **{name: [] for name in trees}}
            order = ["pdsh", *trees]
            for i in range(repeat):
                for tool in order[i % len(order):] + order[:i % len(order)]:
                    run = timed(pdsh_argv(cluster, n), pdsh_env) if tool == "pdsh" else timed(argv[tool], envs[tool])
                    walls[tool].append(run.wall)
            pdsh = statistics.median(walls["pdsh"])
            cells = []
            for name in trees:
                ratio = statistics.median(d / p for d, p in zip(walls[name], walls["pdsh"], strict=True))
                cells.append(f"{statistics.median(walls[name]):>15.2f}s  {ratio:>7.2f}")
            print(f"{n:>5}  {pdsh:>6.2f}s  " + "  ".join(cells), flush=True)


def up_rounds(trees: dict[str, Ddpctl], n: int, rounds: int, cap: float, tmp: Path) -> None:
    """`ddpctl up` of the toy job (each tree's) beside the same torchrun by parallel `ssh`
    (bench/launch_teardown.py's manual recipe), the order turning each round."""
    from bench.launch_teardown import Runner

    with start_cluster(n, tmp / f"up-cluster-{n}") as cluster:
        runner = Runner(cluster, tmp, cap, {name.replace(" ", "-"): d.tree for name, d in trees.items()})
        order = ["manual", *trees]
        walls: dict[str, list[float]] = {mode: [] for mode in order}
        for i in range(rounds):
            for mode in order[i % len(order):] + order[:i % len(order)]:
                took, _ = runner.short(mode.replace(" ", "-"))  # a mode names its jobs: no spaces
                if took is None:
                    raise SystemExit(f"{mode}: the toy job failed or ran past {cap:.0f} s at {n} hosts")
                walls[mode].append(took)
        manual = statistics.median(walls["manual"])
        cells = [f"{name} {statistics.median(walls[name]):6.1f}s ÷ manual "
                 f"{statistics.median(d / m for d, m in zip(walls[name], walls['manual'], strict=True)):.2f}"
                 for name in trees]
        print(f"{n:>5}  manual {manual:6.1f}s   " + "   ".join(cells), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, metavar="TREE_OR_REV", help=DDPCTL_HELP)
    parser.add_argument("--calls", type=int, default=20, help="calls per op for the per-call CPU (median)")
    parser.add_argument("--sizes", nargs="*", type=int, default=[16, 32], help="doctor ÷ pdsh (none: skip)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds per size on the cluster")
    parser.add_argument("--no-cluster", action="store_true", help="the per-call figures only")
    parser.add_argument("--up-sizes", nargs="*", type=int, default=[16],
                        help="`up` ÷ manual at these sizes, a cluster each (none: skip)")
    parser.add_argument("--up-rounds", type=int, default=2)
    parser.add_argument("--cap", type=float, default=240.0, help="seconds a toy job may take")
    opts = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        trees = {"this tree": Ddpctl(None, stack), "before": Ddpctl(opts.before, stack)}
        for name, d in trees.items():
            print(f"{name}: {d.label}")
        print(f"\nper call, on this machine ({opts.calls} calls, median CPU): bytes sent with the host's "
              "cache warm | the first call's | the command line's part | the agent's CPU, warm")
        for name, d in trees.items():
            for op, f in per_call(d, opts.calls).items():
                print(f"{name:>10}  {op:>6}  {f['warm_bytes']:>8,} B | {f['cold_bytes']:>8,} B | "
                      f"{f['argv_bytes']:>6,} B | {f['warm_cpu_ms']:6.1f} ms")
        if not opts.no_cluster:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agent-shipping-")))
            os.chmod(tmp, 0o755)
            if opts.sizes:
                cluster_rounds(trees, sorted(opts.sizes), opts.repeat, tmp)
            if opts.up_sizes:
                print("\n`ddpctl up` of a short job ÷ the same torchrun by parallel ssh (medians; per-run ratio)")
            for n in opts.up_sizes:
                up_rounds(trees, n, opts.up_rounds, opts.cap, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
