"""Restarts on a real Slurm cluster: a rank that exits with a listed host-fault code on its node ends
the attempt; the next attempt is a new allocation that excludes that node (sbatch --exclude), with
the same budget, classification and DDPCTL_* environment, and `up` stays attached through it."""

from __future__ import annotations

import json
import re

import pytest

from tests.ddpctl_run import wait_for
from tests.slurm_cluster import require_slurm, start_slurm_cluster
from tests.slurm_run import active_jobs, ddpctl, job_processes, slurm_job

FAULT_ON_RANK_1 = """\
import os, socket, sys
import torch.distributed as dist
dist.init_process_group("gloo")
attempt = os.environ["DDPCTL_ATTEMPT"]
print(f"rank={dist.get_rank()} host={socket.gethostname()} attempt={attempt} "
      f"run={os.environ['DDPCTL_RUN_ID']} prev={os.environ.get('DDPCTL_PREV_FAILURE', '-')}", flush=True)
if attempt == "0" and dist.get_rank() == 1:
    sys.exit(75)  # this node's GPU is gone, says the script
dist.barrier()
print(f"rank={dist.get_rank()} done attempt={attempt}", flush=True)
"""
LINE = re.compile(r"rank=(\d) host=(\S+) attempt=(\d) run=(\S+) prev=(.*)$", re.MULTILINE)


def test_a_faulty_node_is_excluded_from_the_next_allocation(tmp_path_factory: pytest.TempPathFactory) -> None:
    require_slurm()
    tmp_path = tmp_path_factory.mktemp("slurm-restart")
    with start_slurm_cluster(3, tmp_path_factory.mktemp("slurm-3")) as c:
        job = slurm_job(tmp_path, "faulty", FAULT_ON_RANK_1, nproc=1)
        job.write_text(job.read_text() + "[restart]\nmax_restarts = 1\nbackoff = 0\nhost_fault_exit_codes = [75]\n")
        up = ddpctl(c, "up", str(job), cwd=tmp_path, timeout=240)
        text = up.stdout + up.stderr
        assert up.returncode == 0, text[-4000:]
        seen = [m.groups() for m in LINE.finditer(up.stdout)]
        first = {int(rank): host for rank, host, attempt, _, _ in seen if attempt == "0"}
        second = {int(rank): host for rank, host, attempt, _, _ in seen if attempt == "1"}
        faulty = first[1]
        assert len(first) == 2 and len(second) == 2 and faulty not in second.values(), text[-4000:]
        assert {run for *_, run, _ in seen} == {next(iter(seen))[3]}  # one run id for both attempts
        assert all(prev.startswith("attempt 0 at ") and "exited with code 75" in prev
                   for _, _, attempt, _, prev in seen if attempt == "1"), text[-4000:]
        assert re.search(rf"excluding Slurm node {faulty} \(node1\) from attempt 1 on: a rank exited with code 75",
                         text), text[-4000:]
        assert "succeeded after 2 attempt(s), 1 restart(s) of at most 1" in text
        (run_dir,) = list((tmp_path / "runs").iterdir())
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["exit_code"] == 0 and [e["host"] for e in summary["excluded"]] == [faulty]
        assert [a["failure"]["class"] if a["failure"] else None for a in summary["attempts"]] == ["host fault", None]
        slurm_id = json.loads((run_dir / "attempt-1" / "slurm.json").read_text())["slurm_job_id"]
        shown = c.slurm("scontrol", "-o", "show", "job", slurm_id).stdout
        assert f"ExcNodeList={faulty} " in shown, shown  # Slurm was asked to keep off it
        assert active_jobs(c) == []
        wait_for(lambda: job_processes(c) == {}, 30, "the job's processes to go")
        logs = ddpctl(c, "logs", summary["run_id"], "--backend", "slurm", cwd=tmp_path)  # the run's newest attempt
        assert logs.returncode == 0 and "done attempt=1" in logs.stdout and "attempt=0" not in logs.stdout, \
            logs.stdout + logs.stderr
