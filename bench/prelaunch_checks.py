"""What the pre-launch checks cost `ddpctl up`: the launch round trip with and without them.

On a real namespace cluster of 2, 4 and 8 hosts, times `launch.preflight.gather` (one agent
session per host over the pool's connections, as `up` runs it) with the checks (facts for the
checks, the TCP probe between the hosts, the checks) and with `--no-checks` (the launch facts
only), interleaved, median of --runs. Connections are opened once per size beforehand, as a
launch has them open by then from the first call. Prints figures and the phase breakdown;
asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from inventory import load_job  # noqa: E402
from orchestrator.launch.preflight import gather  # noqa: E402
from orchestrator.remote.pool import make_pool  # noqa: E402
from orchestrator.remote.ssh_options import Connection, SshOptions  # noqa: E402
from tests.cluster import start_cluster  # noqa: E402
from tests.ddpctl_run import write_job  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4,8")
    parser.add_argument("--runs", type=int, default=7)
    opts = parser.parse_args(argv)
    print(f"{'hosts':>5} {'no checks':>10} {'checks':>10} {'cost':>8}   checks' phases (median)")
    for n in (int(x) for x in opts.sizes.split(",")):
        with tempfile.TemporaryDirectory() as d, start_cluster(n, Path(d) / "cluster") as cluster:
            job = load_job(write_job(Path(d), cluster, "bench", nproc=1, port=29671))
            with make_pool(Connection(SshOptions(ssh_config=cluster.ssh_config))) as pool:
                gather(job, pool, checks=False)  # connections up, as in a launch
                times: dict[bool, list[float]] = {False: [], True: []}
                phases: dict[str, list[float]] = {}
                for _ in range(opts.runs):
                    for checks in (False, True):
                        t0 = time.monotonic()
                        pre = gather(job, pool, checks=checks)
                        times[checks].append(time.monotonic() - t0)
                        if checks:
                            for k, v in pre.phases.items():
                                phases.setdefault(k, []).append(v)
            off, on = statistics.median(times[False]), statistics.median(times[True])
            breakdown = ", ".join(f"{k.removesuffix('_s')} {statistics.median(v):.3f}s" for k, v in phases.items())
            print(f"{n:>5} {off:>9.3f}s {on:>9.3f}s {on - off:>+7.3f}s   {breakdown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
