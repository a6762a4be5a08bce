"""What doctor's programs on the hosts cost the command line and the agent, this tree beside another
(default: the tree before they travelled with the agent): for doctor's smoke test, its bandwidth table
and `--deep`'s host check, the argv of each process a host runs (torchrun's, with the supervisor's
--log-dir, and the program's own: what `ps` shows, and what Linux limits to 128 KiB per argument),
its longest argument, and the agent's bundle (its sources compressed, as a first call to a host or a
Slurm node's node.in carries them; raw).

Each tree's own code builds the plans (a one-host job, no host reached): the programs are caught at
the launch core's door and planned as a launch would plan them. Prints figures; asserts nothing.

    python bench/shipped_programs.py [--before REV_OR_TREE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.jobwatch import DDPCTL_HELP, Ddpctl  # noqa: E402

BEFORE = "b5352f1"  # the last commit before doctor's programs travelled with the agent

# Runs in the tree measured (its own modules first on the path): one JSON line of figures.
PROBE = r"""
import json, zlib
from inventory import LOCALHOST, Inventory, Job, Rendezvous
from orchestrator.doctor import collective_jobs, deep
from orchestrator.launch.plan import build_plan
from orchestrator.remote.agent import agent_code

caught = {}
def catch(job, backend, observer, options=None, *, inline=None, **_):
    caught[job.name] = inline
    raise StopIteration
collective_jobs.core.launch = catch
job = Job(name="m", inventory=Inventory((LOCALHOST,)), hosts=(LOCALHOST,), script="-",
          rendezvous=Rendezvous(None, 29500, "static"))
for run in (lambda: collective_jobs.smoke(job, None, "runs"), lambda: collective_jobs.bandwidth(job, None, "runs")):
    try:
        run()
    except StopIteration:
        pass
caught["ddpctl-deep"] = deep.program(deep.LINKS_BUDGET_S, deep.EXCHANGE_BYTES)
LOG_DIR = "/home/user/.ddpctl/runs/ddpctl-deep-20261207-120000-abcd/node0/torchrun"
out = {}
for name, program in caught.items():
    (launch,) = build_plan(job, "t-1", {LOCALHOST.name: 1}, 29500, inline=program).hosts
    torchrun, worker = launch.argv(LOG_DIR), list(launch.program)
    out[name] = {"torchrun": sum(len(a.encode()) + 1 for a in torchrun),
                 "worker": sum(len(a.encode()) + 1 for a in worker),
                 "longest": max(len(a.encode()) for a in torchrun)}
key, blob = agent_code()
out["agent"] = {"compressed": len(blob), "raw": len(zlib.decompress(blob))}
print(json.dumps(out))
"""


def figures(ddpctl: Ddpctl) -> dict[str, dict[str, int]]:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ddpctl.tree,
                          env=ddpctl.env(), timeout=120, check=True)
    found: dict[str, dict[str, int]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, metavar="TREE_OR_REV", help=DDPCTL_HELP)
    opts = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        trees = {"this tree": Ddpctl(None, stack), "before": Ddpctl(opts.before, stack)}
        measured = {label: figures(tree) for label, tree in trees.items()}
        for label, tree in trees.items():
            print(f"{label}: {tree.label}")
    print("\nper process on a host, bytes of argv (each argument and its NUL): torchrun's | the program's | the "
          "longest argument")
    for name in ("ddpctl-smoke", "ddpctl-bandwidth", "ddpctl-deep"):
        for label, got in measured.items():
            f = got[name]
            print(f"  {name:<17} {label:<9} {f['torchrun']:>8,} | {f['worker']:>8,} | {f['longest']:>8,}")
    print("\nthe agent's bundle (bytes): compressed (a first call's, a node.in's) | raw")
    for label, got in measured.items():
        print(f"  {label:<9} {got['agent']['compressed']:>9,} | {got['agent']['raw']:>9,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
