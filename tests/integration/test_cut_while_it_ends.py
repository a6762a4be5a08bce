"""Issue 54 on the real cluster: SSH to rank 0's host is cut (iptables on port 22 in its namespace:
the training traffic between the hosts still flows) while the job ends, a rank fails, or `ddpctl
down` stops it from another terminal. When the host is reached again, what happened meanwhile is
replayed from its run state and `up` ends as it would have without the cut: its exit code, its
headline and its account, with no traceback. Each test shortens what it waits on: lost_after (the
cut must not lose the host), --connect-timeout (each fresh connection tried during the cut), and
--grace (with it, the bound a host has to confirm a stop)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.launch.outcome import EXIT_STOPPED
from tests.cluster import Cluster
from tests.ddpctl_run import ddpctl_argv, no_job_processes, ssh_args, wait_for
from tests.integration.test_fencing import with_args
from tests.integration.test_restarts import NEVER, finish, job_file, no_attempt_left, run_summary, start
from tests.integration.test_supervision_faults import Blips, connection_blocked, control_connection_port

pytestmark = pytest.mark.cluster

LOST_AFTER = "[supervise]\nlost_after = 30\n"  # longer than each cut: the host is never lost for it
CUT_S = 12  # SSH to node0 cut this long: silent after 8 s, reached again within --connect-timeout after
FAST = ("--connect-timeout", "3")  # each fresh connection tried during the cut gives up this soon
# ddpctl's own trouble: a thread's traceback (at the start of a line: the ranks' are labelled, the
# failure summary's indented), a frame of ours, a message that did not decode, a link thread that failed
NO_BUG = re.compile(r"^(Traceback|Exception in thread)|File \"[^\"]*/orchestrator/|malformed|ddpctl bug", re.MULTILINE)
STEP = re.compile(r"^\[node\d:\d\]\s+attempt 0 rank (\d) step (\d+) t=(\d+\.\d+)$", re.MULTILINE)


class Cut:
    """SSH to and from node0 (rank 0's host) cut for CUT_S; its first control connection stays
    blocked after that (a stuck connection's first byte may leave long after a cut: CLUSTER-RECIPE),
    so that `up` reaches node0 again only by re-attaching on a fresh one."""

    def __init__(self, cluster: Cluster, seconds: float) -> None:
        self.cluster, self.port = cluster, control_connection_port(cluster, 0)
        connection_blocked(cluster, 0, self.port, True)
        self.blips = Blips(cluster, {0: seconds})

    def end(self) -> None:
        """Fresh connections get through again (the first one stays stuck)."""
        self.blips.end(0)

    def close(self) -> None:
        self.blips.close()
        connection_blocked(self.cluster, 0, self.port, False)


def cut_at(out: Path, cluster: Cluster, line: str, seconds: float = CUT_S) -> Cut:
    """The cut, once `up`'s output shows `line`."""
    wait_for(lambda: line in out.read_text(), 120, repr(line))
    return Cut(cluster, seconds)


def until_it_ends(proc: subprocess.Popen[str], cut: Cut, out: Path) -> tuple[int, str]:
    try:
        code = finish(proc, 120)
    finally:
        cut.close()
    text = out.read_text()
    assert not NO_BUG.search(text), text[-4000:]
    return code, text


def reattached_once(text: str) -> None:
    assert len(re.findall(r"lost contact with node0 at \d\d:\d\d:\d\d", text)) == 1, text[-4000:]
    assert len(re.findall(r"node0 back after \d+s: re-attached on a fresh connection", text)) == 1, text[-4000:]


def test_a_cut_to_rank_0s_host_while_the_job_ends_ends_up_as_without_the_cut(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    """The issue's run: restarts with a spare, the job's last steps taken and its ranks exited
    during the cut. Nothing is restarted, every step line arrives once, and the account counts no
    productive time in the cut (the replayed step records count from when the ranks wrote them)."""
    cluster = make_cluster(3)
    job = with_args(job_file(tmp_path, cluster, "ends-cut", [40, 0.1, 5, -1, NEVER, "raise", "0"], spares=[2],
                             restart="max_restarts = 1", supervise=LOST_AFTER), "--stamp")
    proc, runs, out = start(job, tmp_path, cluster, *FAST)
    code, text = until_it_ends(proc, cut_at(out, cluster, "attempt 0 rank 0 step 10 "), out)
    assert code == 0, text[-4000:]
    reattached_once(text)
    steps: dict[int, list[int]] = {}
    for rank, step, _t in STEP.findall(text):
        steps.setdefault(int(rank), []).append(int(step))
    assert steps == {0: list(range(40)), 1: list(range(40))}, text[-4000:]  # none lost, none twice
    summary = run_summary(runs)
    assert summary["exit_code"] == 0 and len(summary["attempts"]) == 1
    headline, last = text.rstrip().splitlines()[-2:]
    assert re.fullmatch(rf"ddpctl: run {summary['run_id']} succeeded after 1 attempt\(s\), 0 restart\(s\) of at "
                        r"most 1; logs: \S+", headline), headline
    account: dict[str, Any] = summary["account"]
    assert last == f"ddpctl: {account['line']}", last
    assert account["outcome"] == "ok" and account["hosts"] == {}, account  # no host charged
    assert {p["kind"] for p in account["parts"]} <= {"start-up", "shutdown"}, account
    stamps = [float(t) for _r, _s, t in STEP.findall(text)]
    assert account["productive_s"] <= max(stamps) - min(stamps) + 1.0, (account, max(stamps) - min(stamps))
    wait_for(lambda: no_attempt_left(cluster, summary, [0, 1]), 30, "no job process left")


def test_a_rank_that_fails_during_the_cut_is_named_as_without_it(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    """Rank 0 fails on node0 while SSH to it is cut: rank 1 on node1 loses its peer (that error
    comes first, live, and stops the job), node0 is reached again within the stop's bound, and its
    replayed records name rank 0's own error as the cause."""
    cluster = make_cluster(2)
    job = with_args(job_file(tmp_path, cluster, "fails-cut", [400, 0.1, 5, 20, cluster.hostname(0), "raise", "all"],
                             restart="max_restarts = 0", supervise=LOST_AFTER), "--stamp")
    proc, runs, out = start(job, tmp_path, cluster, *FAST, "--grace", "8")  # the stop's bound: 18 s
    code, text = until_it_ends(proc, cut_at(out, cluster, "attempt 0 rank 0 step 10 "), out)
    assert code == 1, text[-4000:]
    reattached_once(text)
    assert re.search(r"^first failure: rank 0 on node0 \(node_rank 0, local rank 0\): ValueError: bad batch at "
                     r"step 20$", text, re.MULTILINE), text[-4000:]
    assert "lost at" not in text and "did not confirm" not in text, text[-4000:]
    summary = run_summary(runs)
    assert summary["exit_code"] == 1 and summary["first_failure"] == "node0" and summary["lost"] is None
    assert summary["account"]["outcome"] == "failed"
    assert list(summary["account"]["hosts"]) == ["node0"], summary["account"]  # its failure, not node1's echo
    wait_for(lambda: no_job_processes(cluster, summary["job_id"]), 30, "no job process left")


def test_ddpctl_down_during_the_cut_is_the_headline_as_without_it(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    """`ddpctl down` from a second terminal stops node1 (node0 it cannot reach): `up` hears it from
    node1, stops the job, and ends once node0 is reached again (its ranks failed for want of their
    peer: consequences of the stop) saying who stopped it, with the stop's exit code."""
    cluster = make_cluster(2)
    job = job_file(tmp_path, cluster, "down-cut", [400, 0.1, 5, -1, NEVER, "raise", "0"],
                   restart="max_restarts = 0", supervise=LOST_AFTER)
    proc, runs, out = start(job, tmp_path, cluster, *FAST, "--grace", "8")  # the stop's bound: 18 s
    cut = cut_at(out, cluster, "attempt 0 rank 1 step 10", seconds=120)  # until `up` has heard of the stop
    down = subprocess.Popen(ddpctl_argv("down", str(job), *ssh_args(cluster)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # a second terminal
    try:
        wait_for(lambda: "stopping the job on every host" in out.read_text(), 60, "`up` to hear of the stop")
        cut.end()
        said = down.communicate(timeout=90)[0]
        assert re.search(r"^node1: stopped ", said, re.MULTILINE), said
    finally:
        if down.poll() is None:
            down.kill()
        code, text = until_it_ends(proc, cut, out)
    assert code == EXIT_STOPPED, text[-4000:]
    reattached_once(text)
    assert text.index("stopping the job on every host") < text.index("node0 back after"), text[-4000:]
    headline = re.compile(r"stopped by `ddpctl down` \(by \S+ on \S+ at \d\d:\d\d:\d\d\)")
    assert re.search(r"^" + headline.pattern + r"$", text, re.MULTILINE), text[-4000:]
    verdict, account = text.rstrip().splitlines()[-2:]
    assert headline.search(verdict) and f"(exit {EXIT_STOPPED})" in verdict, verdict
    assert "first failure" not in text, text[-4000:]
    summary = run_summary(runs)
    assert summary["exit_code"] == EXIT_STOPPED and headline.fullmatch(str(summary["stopped_by"]))
    assert summary["account"]["outcome"] == "stopped" and account == f"ddpctl: {summary['account']['line']}"
    wait_for(lambda: no_job_processes(cluster, summary["job_id"]), 30, "no job process left")
