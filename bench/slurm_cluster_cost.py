"""How long the Slurm test cluster (tests/slurm_cluster.py) takes to come up and to go: a login node
(munged, slurmctld, sshd) and --nodes compute nodes (one slurmd each, in network namespaces), --runs
times, brought up until slurmctld schedules and torn down until nothing of it is left.

tests/integration/test_slurm_cluster_fixture.py asserts what the cluster is and that it leaves
nothing behind; these are the figures of how long that takes on this machine. Prints figures;
asserts nothing.

    python bench/slurm_cluster_cost.py [--runs 3] [--nodes 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.slurm_cluster import slurm_unavailable_reason, start_slurm_cluster  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2, help="compute nodes (the fixture's: 2)")
    opts = parser.parse_args(argv)
    reason = slurm_unavailable_reason()
    if reason:
        print(f"no Slurm cluster here: {reason}")
        return 1
    ups, downs = [], []
    for run in range(opts.runs):
        with tempfile.TemporaryDirectory(prefix="slurm-cost-") as work:
            cluster = start_slurm_cluster(opts.nodes, Path(work))
            cluster.teardown()
        ups.append(cluster.bring_up_s)
        downs.append(cluster.teardown_s)
        print(f"run {run + 1}: up {cluster.bring_up_s:.2f} s, teardown {cluster.teardown_s:.2f} s", flush=True)
    print(f"\nSlurm test cluster, login node + {opts.nodes} compute node(s), median of {opts.runs}: "
          f"up {statistics.median(ups):.2f} s (max {max(ups):.2f}), teardown {statistics.median(downs):.2f} s "
          f"(max {max(downs):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
