"""Short collective jobs (smoke test, bandwidth) run through the real launch path, shipped inline.

The program travels as `python -c <loader>`, with the train_jobs sources it needs embedded, so a
host needs torch but not this repository. torchrun runs it with --no-python.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import train_jobs
from inventory import Job, Rendezvous
from orchestrator.hosts import HostPool
from orchestrator.launch import HostRun, Launch, LaunchOptions, RunResult
from orchestrator.plan import HostLaunch, LaunchPlan, build_plan, new_job_id
from orchestrator.preflight import gather, settle_master_port

TRAIN_JOBS = Path(train_jobs.__file__).parent

LOADER = """\
import base64, json, sys, types, zlib
srcs = json.loads(zlib.decompress(base64.b64decode(sys.argv[1])))
main = sys.argv[2]
sys.argv = [main] + sys.argv[3:]
for name in sorted(srcs):
    if name != main:
        mod = types.ModuleType(name)
        if "." not in name:
            mod.__path__ = []
        sys.modules[name] = mod
for name in sorted(srcs):
    if name != main:
        exec(compile(srcs[name], name, "exec"), sys.modules[name].__dict__)
exec(compile(srcs[main], main, "exec"), {"__name__": "__main__", "__file__": main})
"""


def inline_program(python: str, modules: dict[str, str], main: str, args: Sequence[str]) -> tuple[str, ...]:
    """argv running `main` with `modules` importable, none of them needing to exist on the host."""
    blob = base64.b64encode(zlib.compress(json.dumps(modules).encode(), 9)).decode()
    return (python, "-c", LOADER, blob, main, *args)


def train_jobs_sources(*relative: str) -> dict[str, str]:
    out = {"train_jobs": (TRAIN_JOBS / "__init__.py").read_text()}
    for rel in relative:
        name = "train_jobs." + rel.removesuffix(".py").replace("/", ".")
        out[name] = (TRAIN_JOBS / rel).read_text()
    return out


@dataclass
class Collected:
    """A Callbacks implementation that keeps lines instead of printing them."""

    lines: list[tuple[str, str | None, str]] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)

    def on_line(self, host: str, rank: str | None, text: str) -> None:
        self.lines.append((host, rank, text))

    def on_state(self, run: HostRun) -> None:
        return None

    def on_notice(self, text: str) -> None:
        self.notices.append(text)


@dataclass
class CollectiveRun:
    result: RunResult
    output: Collected
    plan: LaunchPlan


def run_collective(job: Job, pool: HostPool, name: str, program: tuple[str, ...] | None,
                   sources: dict[str, str], main: str, args: Sequence[str], nproc: int,
                   runs_dir: Path, deadline: float) -> CollectiveRun:
    """Launch `main` with 1..nproc ranks per host on the job's hosts, stop it past `deadline`."""
    job = replace(job, name=name, nproc_per_node=nproc,
                  rendezvous=Rendezvous(job.rendezvous.master_addr, job.rendezvous.master_port, "static"))
    facts = gather(job, pool)
    port = settle_master_port(job, pool, facts, free_foreign=False, notice=lambda _t: None)
    job_id = new_job_id(name)
    plan = build_plan(job, job_id, {h.name: nproc for h in job.hosts}, port)
    hosts = tuple(
        HostLaunch(hl.host, hl.node_rank, hl.nproc, (*hl.launcher, "--no-python"),
                   program or inline_program(hl.host.python, sources, main, args), hl.env, hl.cwd)
        for hl in plan.hosts)
    plan = replace(plan, hosts=hosts)
    out = Collected()
    options = LaunchOptions(grace=3.0, hang_timeout=deadline, on_hang="stop", dump_stacks_on_hang=False)
    result = Launch(plan, pool, out, runs_dir / job_id, options).run()
    return CollectiveRun(result, out, plan)


SMOKE_LINE = re.compile(r"DDPCTL-SMOKE rank=(\d+) world=(\d+) ok=(\w+)")


def smoke(job: Job, pool: HostPool, runs_dir: Path, deadline: float = 60.0) -> CollectiveRun:
    return run_collective(job, pool, "ddpctl-smoke", None, train_jobs_sources("smoke.py"),
                          "train_jobs.smoke", [], 1, runs_dir, deadline)


def bandwidth(job: Job, pool: HostPool, runs_dir: Path, max_bytes: str = "64M",
              deadline: float = 300.0) -> tuple[CollectiveRun, dict[str, Any] | None]:
    """The allreduce_bench job across the hosts; returns its BANDWIDTH json (rank 0's)."""
    sources = train_jobs_sources("common.py", "allreduce_bench/__init__.py", "allreduce_bench/bench.py")
    run = run_collective(job, pool, "ddpctl-bandwidth", None, sources, "train_jobs.allreduce_bench.bench",
                         ["--json", "--max-bytes", max_bytes, "--iters", "5", "--warmup", "2"],
                         1, runs_dir, deadline)
    for _host, _rank, text in run.output.lines:
        if text.startswith("BANDWIDTH "):
            return run, json.loads(text[len("BANDWIDTH "):])
    return run, None
