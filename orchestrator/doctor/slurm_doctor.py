"""`ddpctl doctor` for a Slurm job: the controller's checks (two scontrol calls), then, when the
job can start, doctor's node checks in one short allocation (orchestrator/checks/slurm_nodes.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

from inventory import Job
from orchestrator.checks.base import skip
from orchestrator.checks.model import CheckStatus, Report
from orchestrator.checks.slurm_controller import Controller, controller_checks, controller_host, unreachable_finding
from orchestrator.checks.slurm_nodes import ALLOC, NodeRun, check_order, node_checks, node_phase, read_controller
from orchestrator.errors import HostError
from orchestrator.remote.pool import HostPool
from orchestrator.remote.slurm_client import slurm_client


def run_slurm_doctor(job: Job, pool: HostPool, timeout_s: float = 120.0, use_cache: bool = True,
                     notice: Callable[[str], None] = lambda _: None) -> Report:
    """The controller checks, then (when the job can start) the node checks in one allocation."""
    assert job.slurm is not None, "run_slurm_doctor needs a job with a [slurm] table"
    spec, started = job.slurm, time.monotonic()
    where, client = controller_host(spec), slurm_client(pool, spec.login, job.inventory)
    notice(f"asking Slurm on {client.where} about the partition and its config")
    try:
        ctrl: Controller | None = read_controller(client)
    except HostError as err:
        ctrl, findings = None, [unreachable_finding(err, where, client.where)]
    if ctrl is not None:
        findings = controller_checks(ctrl, spec, where, client.where)
    asked, run = time.monotonic(), NodeRun(where)
    if ctrl is None or any(f.status == CheckStatus.FAIL for f in findings):
        findings += [skip(c, where, "not run: the job cannot start (see the errors above)")
                     for c in (ALLOC, *node_checks())]
    else:
        run, more = node_phase(client, job, ctrl, timeout_s, use_cache, notice)
        findings += more
    # The controller's row shows only its own findings: Report scopes cluster-wide (host None)
    # findings away from the hosts in `unreachable`.
    return Report(hosts=[where, *run.nodes], checks=list(check_order()), findings=findings,
                  unreachable={where, *run.failed}, elapsed_s=time.monotonic() - started,
                  phases={"controller_s": asked - started, "nodes_s": time.monotonic() - asked})
