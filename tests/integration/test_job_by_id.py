"""A job found by its id alone, on the real cluster: `up` prints the follow-up commands as they
work, and `ps --job`, `logs`, `top`, `stacks` and `down` given only the id (no -i, no SSH flags)
reach the job's hosts through this machine's run record, from the directory `up` ran in."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.launch.outcome import EXIT_STOPPED
from tests.cluster import Cluster
from tests.cluster_files import write_hosts_toml
from tests.ddpctl_run import ddpctl_argv, run_ddpctl, ssh_args, wait_for
from tests.integration.test_restarts import NEVER, finish, job_file

pytestmark = pytest.mark.cluster


def test_the_id_up_printed_is_all_a_later_command_needs(cluster2: Cluster, tmp_path: Path) -> None:
    job = job_file(tmp_path, cluster2, "by-id", [400, 0.1, 5, -1, NEVER, "raise", "0"], restart="max_restarts = 0")
    out = tmp_path / "up.out"
    proc = subprocess.Popen(ddpctl_argv("up", str(job), "--grace", "3", *ssh_args(cluster2)), cwd=tmp_path,
                            stdout=out.open("w"), stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: "rank 1 step 5" in out.read_text(), 120, "step 5")
        text = out.read_text()
        job_id = re.search(r"job (\S+): 2 host\(s\)", text).group(1)  # type: ignore[union-attr]
        assert f"follow: ddpctl logs {job_id} -f; ddpctl top {job_id}; ddpctl down {job_id}" in text, text[-3000:]
        assert (tmp_path / "runs" / job_id / "run.json").is_file()

        ps = run_ddpctl("ps", "--job", job_id, cwd=tmp_path)
        assert ps.returncode == 0 and "node0" in ps.stdout and "node1" in ps.stdout, ps.stdout + ps.stderr
        logs = run_ddpctl("logs", job_id, cwd=tmp_path)
        assert logs.returncode == 0, logs.stderr
        assert re.search(r"^\[node1:1\]\s+attempt 0 rank 1 step 3$", logs.stdout, re.MULTILINE), logs.stdout[-2000:]
        top = run_ddpctl("top", job_id, "--once", cwd=tmp_path)
        assert top.returncode == 0 and "node0" in top.stdout and "node1" in top.stdout, top.stdout + top.stderr
        stacks = run_ddpctl("stacks", job_id, cwd=tmp_path)
        assert stacks.returncode == 0 and "ranks 0–1: main in resumable.py" in stacks.stdout, stacks.stdout
        one = tmp_path / "node0 'only'.toml"  # an explicit -i wins over the record: node0 alone
        write_hosts_toml(one, [(cluster2.hosts[0].name, cluster2.hosts[0].address)], sys.executable)
        ps0 = run_ddpctl("ps", "--job", job_id, "-i", str(one), *ssh_args(cluster2), cwd=tmp_path)
        assert ps0.returncode == 0 and "node0" in ps0.stdout and "node1" not in ps0.stdout, ps0.stdout + ps0.stderr
        elsewhere = run_ddpctl("logs", job_id, cwd=tmp_path.parent)  # no record there: this machine only
        assert elsewhere.returncode == 1 and "checked 1 host: localhost" in elsewhere.stderr, elsewhere.stderr
        down = run_ddpctl("down", job_id, cwd=tmp_path)
        assert down.returncode == 0 and re.search(rf"node\d: stopped {job_id}", down.stdout), down.stdout + down.stderr
        assert finish(proc) == EXIT_STOPPED
    finally:
        if proc.poll() is None:
            proc.kill()
