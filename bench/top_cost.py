"""What `ddpctl top` costs a host: the CPU seconds its sampling takes per host per second of watching.

Runs the top op's sampling function (node_agent/ops/top.py `sample`) back to back at its cadence
(--interval, 2 s: each sample waits its interval between the two readings) for --seconds against a
job on this machine, and reads the CPU it took from getrusage: this process (the sampling, its
nvidia-smi thread) and its children (nvidia-smi itself, where it is installed). The job is a
stand-in by default: a launcher and --ranks rank processes carrying a job id, with a node state
and step records as ddpctl writes them (--job JOB: a real ddpctl job running here instead).
Then the same number of whole ops, each a fresh `python -S` node agent as `top` starts over SSH
on every refresh (this machine's local transport: sshd's own share is not in it).

Prints both figures in CPU seconds per host per second and per sample.

    python bench/top_cost.py [--seconds 20] [--interval 2] [--ranks 8] [--job JOB] [--proc auto|psutil|proc]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from inventory import local_inventory  # noqa: E402
from node_agent.ops import top  # noqa: E402
from orchestrator.remote.agent import call_agent  # noqa: E402
from orchestrator.remote.transport import LocalTransport  # noqa: E402
from tests.unit.top_fakes import fake_job  # noqa: E402

WINDOW = {"steps": 20, "seconds": 2.0, "p50_ms": 98.0, "p95_ms": 131.0}


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (user + system)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(step: Callable[[], object], seconds: float, interval: float) -> tuple[int, float, float]:
    """Call `step` (which itself takes about `interval`) until `seconds` have passed: (calls, CPU
    seconds, wall seconds)."""
    calls = 0
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    while time.monotonic() - wall0 < seconds - interval / 2:
        started = time.monotonic()
        step()
        calls += 1
        rest = interval - (time.monotonic() - started)
        if rest > 0:  # the whole op's own wait is inside it; a fast one keeps the cadence here
            time.sleep(rest)
    return calls, cpu_seconds() - cpu0, time.monotonic() - wall0


@contextlib.contextmanager
def stand_in(ranks: int) -> Iterator[str]:
    """A job of `ranks` processes on this machine, under a temporary DDPCTL_STATE_ROOT; its id."""
    root = Path(tempfile.mkdtemp(prefix="ddpctl-top-bench-"))
    old = os.environ.get("DDPCTL_STATE_ROOT")
    os.environ["DDPCTL_STATE_ROOT"] = str(root)  # inherited by the whole op's agent
    try:
        with fake_job(root, "topbench-20250101-000000-0000", env={"GLOO_SOCKET_IFNAME": "lo"}, nproc=ranks) as job:
            for i in range(ranks):
                job.write_step(i, i, 100, window=WINDOW)
            yield job.job_id
    finally:
        if old is None:
            os.environ.pop("DDPCTL_STATE_ROOT", None)
        else:
            os.environ["DDPCTL_STATE_ROOT"] = old
        shutil.rmtree(root, ignore_errors=True)


def report(label: str, calls: int, cpu: float, wall: float) -> None:
    print(f"  {label}: {calls} samples in {wall:.1f} s, {cpu:.3f} CPU s: "
          f"{cpu / wall:.5f} CPU s per host per second, {1000 * cpu / max(calls, 1):.1f} ms per sample")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="how long each measurement watches")
    p.add_argument("--interval", type=float, default=2.0, help="top's cadence (each sample's interval)")
    p.add_argument("--ranks", type=int, default=8, help="rank processes of the stand-in job")
    p.add_argument("--job", help="a ddpctl job running on this machine, instead of the stand-in")
    p.add_argument("--proc", choices=["auto", "psutil", "proc"], default="auto",
                   help="how processes are read in the in-process figure (the whole op: auto)")
    args = p.parse_args(argv)
    use_psutil = {"auto": None, "psutil": True, "proc": False}[args.proc]
    nvidia_smi = shutil.which("nvidia-smi")
    with contextlib.ExitStack() as stack:
        job = args.job or stack.enter_context(stand_in(args.ranks))
        first = top.sample(job, 0.0, use_psutil=use_psutil)
        nodes = [n for n in first["nodes"] if n["running"]]
        if not nodes:
            print(f"error: no running node of job {job} on this machine", file=sys.stderr)
            return 1
        print(f"ddpctl top's sampling cost on {first['hostname']}: job {job}, "
              f"{sum(n['processes'] for n in nodes)} processes ({first['proc_source']}), "
              f"{len(first['gpus'])} GPUs ({nvidia_smi or 'no nvidia-smi: a CPU host, no GPU sample'}), "
              f"interval {args.interval:g} s, {args.seconds:g} s each")
        calls, cpu, wall = measure(lambda: top.sample(job, args.interval, use_psutil=use_psutil),
                                   args.seconds, args.interval)
        report("sampling function (in process)", calls, cpu, wall)
        transport = LocalTransport(local_inventory().hosts[0])
        request = {"job": job, "interval": args.interval}
        calls, cpu, wall = measure(lambda: call_agent(transport, "top", request, timeout=args.interval + 30),
                                   args.seconds, args.interval)
        report("whole op (a fresh python -S agent per sample, no sshd)", calls, cpu, wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
