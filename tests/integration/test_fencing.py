"""No attempt beside a lost one, on the real cluster (orchestrator/restarts/fence.py): a host cut
off from `up` while its rank works alone is reached again and its part ended before the next
attempt starts; two hosts killed at once are both left out, and the run says it ended shrunk."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.cluster_sys import kill_netns
from tests.ddpctl_run import wait_for
from tests.integration.test_restarts import NEVER, finish, job_file, no_attempt_left, run_summary, start
from tests.integration.test_supervision_faults import ssh_blocked

pytestmark = pytest.mark.cluster

LOST_AFTER = "[supervise]\nlost_after = 10\n"  # the test waits on it: shortened (the fault model's least)


def with_args(job: Path, *extra: str) -> Path:
    """The job file with more of train_jobs/resumable.py's flags."""
    lines = job.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("args = "))
    lines[at] = "args = " + json.dumps([*json.loads(lines[at].removeprefix("args = ")), *extra])
    job.write_text("\n".join(lines) + "\n")
    return job


class LastSeen:
    """Polls host i for processes of one job; `last` is when any was last seen alive."""

    def __init__(self, cluster: Cluster, i: int, job_id: str) -> None:
        self.cluster, self.i, self.job_id = cluster, i, job_id
        self.last = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done.wait(0.1):
            if self.cluster.job_pids(self.i, self.job_id):
                self.last = time.time()

    def close(self) -> None:
        self.done.set()
        self.thread.join()


def test_a_lost_host_whose_rank_works_alone_is_fenced_before_the_next_attempt(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    """The issue's split brain: rank 0 on node0 works alone (no collective) while SSH to node0 is
    blocked both ways for longer than lost_after. node0 is lost and a spare takes its place, but
    attempt 1 starts only once node0 is reached again and its ranks are ended."""
    cluster = make_cluster(3)
    job = with_args(job_file(tmp_path, cluster, "busy", [60, 0.1, 5, -1, NEVER, "raise", "0"], spares=[2],
                             restart="max_restarts = 1", supervise=LOST_AFTER),
                    "--busy-at", "6", "--busy-s", "300", "--stamp")
    proc, runs, out = start(job, tmp_path, cluster)
    watcher: LastSeen | None = None
    blocked = False
    try:
        wait_for(lambda: "attempt 0 rank 0 busy on its own" in out.read_text(), 120, "rank 0 busy")
        run_id = next(runs.iterdir()).name
        watcher = LastSeen(cluster, 0, f"{run_id}.0")
        ssh_blocked(cluster, 0, True)
        blocked = True
        wait_for(lambda: "node0 lost" in out.read_text(), 60, "node0 lost")
        # SSH is back right after the loss, before node0's own limit (1.5 x lost_after after it last
        # heard `up`): node0's rank goes on, alone, until the fence reaches node0 again
        assert "resumes at step" not in out.read_text().split("attempt 0 rank 0 busy")[-1]  # no attempt 1 yet
        ssh_blocked(cluster, 0, False)
        blocked = False
        code = finish(proc)
    finally:
        if blocked:
            ssh_blocked(cluster, 0, False)
        if watcher is not None:
            watcher.close()
    text = out.read_text()
    assert code == 0, text[-4000:]
    assert re.search(r"fencing node0 before attempt 1: reaching it again", text), text[-4000:]
    assert re.search(r"node0 reached again: (ended \d+ process\(es\) of|nothing of) \S+\.0", text), text[-4000:]
    first = re.search(r"attempt 1 rank \d+ on \S+ resumes at step \d+; .* t=(\d+\.\d+)", text)
    assert first, text[-4000:]
    assert watcher.last > 0 and watcher.last < float(first.group(1)), \
        "a process of attempt 0 was alive on node0 after attempt 1's first rank started"
    summary = run_summary(runs)
    assert [a["hosts"] for a in summary["attempts"]] == [["node0", "node1"], ["node1", "node2"]]
    assert summary["attempts"][0]["fenced"][0]["host"] == "node0"
    assert summary["attempts"][0]["fenced"][0]["how"] == "reached"
    mark = json.loads((tmp_path / "ckpt" / ".ddpctl-attempt").read_text())
    assert (mark["run_id"], mark["attempt"]) == (run_id, 1)
    wait_for(lambda: no_attempt_left(cluster, summary, [0, 1, 2]), 30, "no job process left")


def test_two_hosts_killed_at_once_are_both_left_out_and_the_run_says_it_shrunk(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(4)
    job = job_file(tmp_path, cluster, "two-lost", [30, 0.1, 5, -1, NEVER, "raise", "0"], spares=[3],
                   restart="max_restarts = 2\nmin_nodes = 2", supervise=LOST_AFTER)
    proc, runs, out = start(job, tmp_path, cluster)
    wait_for(lambda: "rank 2 step 7" in out.read_text(), 120, "step 7")
    kill_netns([cluster.hosts[1].netns, cluster.hosts[2].netns])
    code = finish(proc)
    text = out.read_text()
    assert code == 0, text[-4000:]
    assert re.search(r"attempt 0 failed \(host fault\): node\d lost at .*; also lost: node\d", text), text[-4000:]
    assert "leaving node1 out of attempt 1 on: node1 lost" in text
    assert "leaving node2 out of attempt 1 on: node2 lost" in text
    summary = run_summary(runs)
    assert [a["hosts"] for a in summary["attempts"]] == [["node0", "node1", "node2"], ["node0", "node3"]]
    assert summary["restarts"] == 1  # one failure, both hosts charged: no attempt plans a dead host
    assert {f["host"]: f["how"] for f in summary["attempts"][0]["fenced"]} == \
        {"node1": "waited out", "node2": "waited out"}  # sshd died with them: never reached
    assert "shrunk: it ended on 2 of 3 hosts: node0, node3" in text
    assert summary["shrunk"] == "on 2 of 3 hosts: node0, node3"
    wait_for(lambda: no_attempt_left(cluster, summary, [0, 3]), 30, "no job process left")
