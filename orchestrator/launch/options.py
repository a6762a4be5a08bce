"""How a job is launched and supervised: the knobs `ddpctl up` flags and the Python API share."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from orchestrator.hostops.runrecord import Reach

OnHang = Literal["report", "stop"]


@dataclass(frozen=True)
class LaunchOptions:
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL
    hang_timeout: float | None = None  # no output from any rank for this long: a hang
    on_hang: OnHang = "report"  # "report": dump stacks and go on; "stop": dump, then stop the job
    dump_on_interrupt: bool = False  # Ctrl-C dumps every rank's stack before stopping
    nccl_debug: bool = False  # NCCL_DEBUG=INFO with a per-host NCCL_DEBUG_FILE, parsed after
    dump_stacks_on_hang: bool = True
    free_port: bool = False  # kill a non-ddpctl holder of the master port (--free-port)
    runs_dir: Path = Path("runs")  # run logs and summary.json go to runs_dir/<job id>/
    run_dir: Path | None = None  # this launch's own directory instead (a restart's attempt-<n>/)
    checks: bool = True  # the pre-launch checks (--no-checks turns them off)
    # a host that fails stops the job on every host; False: each host runs on its own (a per-host
    # program: doctor --deep), and a monitor decides when the job stops
    fail_fast: bool = True
    sync: bool = True  # copy the source to the hosts first, where the job has [sync] (--no-sync)
    lost_after: float | None = None  # a silent host is lost after this long (None: the job file's
    # [supervise] lost_after, else the fault model's default: orchestrator/launch/faults.py)
    join_timeout: float | None = None  # ranks not all joined after this long: diagnose and stop
    # (None: the job file's [rendezvous] join_timeout; 0: no watchdog)
    reach: Reach = field(default_factory=Reach)  # the SSH settings, kept in the run record for later commands

    def run_dir_of(self, job_id: str) -> Path:
        """Where a launch with this job id keeps its logs, summary.json and backend records."""
        return self.run_dir if self.run_dir is not None else self.runs_dir / job_id
