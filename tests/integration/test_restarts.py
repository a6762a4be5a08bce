"""Restarts on the real cluster (orchestrator/restarts/loop.py): a host killed, a host that exits
with a listed host-fault code, a spare that fails the pre-launch checks, a job that shrinks, a
deterministic bug, a budget spent, Ctrl-C in a backoff, a detached run. The job
(train_jobs/resumable.py) saves a checkpoint every few steps into DDPCTL_CHECKPOINT_DIR and resumes
from it. Every test ends with no job process left."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.cluster import Cluster
from tests.cluster_files import write_hosts_toml
from tests.cluster_sys import kill_netns
from tests.ddpctl_run import ddpctl_argv, run_ddpctl, ssh_args, wait_for

pytestmark = pytest.mark.cluster

RESUMABLE = Path(__file__).resolve().parents[2] / "train_jobs" / "resumable.py"
NEVER = "-"


def inventory(cluster: Cluster, path: Path, spares: Sequence[int] = ()) -> Path:
    write_hosts_toml(path, [(h.name, h.address) for h in cluster.hosts], sys.executable,
                     [cluster.hosts[i].name for i in spares])
    return path


def train_args(steps: int, delay: float, every: int, fail_at: int, fail_host: str, how: str,
               attempts: str) -> list[str]:
    """train_jobs/resumable.py's flags: the run's steps, each step's sleep, a checkpoint every N
    steps, then the fault: at which step, on which host, how, on which attempts."""
    return ["--steps", str(steps), "--delay", str(delay), "--every", str(every), "--fail-at", str(fail_at),
            "--fail-host", fail_host, "--fail-how", how, "--fail-attempts", attempts]


def job_file(tmp_path: Path, cluster: Cluster, name: str, args: Sequence[object], *, spares: Sequence[int] = (),
             restart: str = "max_restarts = 2", supervise: str = "") -> Path:
    """A job of train_jobs/resumable.py (`args`: train_args's) with a [restart] table."""
    script = RESUMABLE
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    hosts = inventory(cluster, tmp_path / "hosts.toml", spares)
    text = textwrap.dedent(f"""\
        inventory = {json.dumps(str(hosts))}
        [job]
        name = {json.dumps(name)}
        script = {json.dumps(str(script))}
        args = {json.dumps(train_args(*args))}
        nproc_per_node = 1
        [rendezvous]
        master_port = "auto"
        [env]
        GLOO_SOCKET_IFNAME = "eth0"
        [restart]
        checkpoint_dir = {json.dumps(str(tmp_path / "ckpt"))}
        """) + restart + ("" if "backoff" in restart else "\nbackoff = 0") + "\n" + supervise
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def start(job: Path, tmp_path: Path, cluster: Cluster, *extra: str) -> tuple[subprocess.Popen[str], Path, Path]:
    runs, out = tmp_path / "runs", tmp_path / "up.out"
    proc = subprocess.Popen(ddpctl_argv("up", str(job), "--runs-dir", str(runs), "--grace", "3", *extra,
                                        *ssh_args(cluster)), stdout=out.open("w"), stderr=subprocess.STDOUT, text=True)
    return proc, runs, out


def finish(proc: subprocess.Popen[str], timeout: float = 150) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def up_to_its_end(job: Path, tmp_path: Path, cluster: Cluster, code: int) -> tuple[str, dict[str, Any]]:
    """`ddpctl up` of `job` to its end, which must be `code`: its output and the run's summary."""
    proc, runs, out = start(job, tmp_path, cluster)
    got = finish(proc)
    text = out.read_text()
    assert got == code, text[-4000:]
    return text, run_summary(runs)


def run_summary(runs: Path) -> dict[str, Any]:
    (run,) = list(runs.iterdir())
    data: dict[str, Any] = json.loads((run / "summary.json").read_text())
    return data


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def no_attempt_left(cluster: Cluster, summary: dict[str, Any], hosts: Sequence[int]) -> bool:
    return all(not cluster.job_pids(i, a["job_id"]) for a in summary["attempts"] for i in hosts)


def test_killed_master_host_resumes_on_a_spare_from_the_checkpoint(make_cluster: Callable[[int], Cluster],
                                                                   tmp_path: Path) -> None:
    cluster = make_cluster(3)
    job = job_file(tmp_path, cluster, "kill-master", [40, 0.15, 5, -1, NEVER, "raise", "0"], spares=[2],
                   supervise="[supervise]\nlost_after = 10\n")  # the fence waits out 1.5 x lost_after: shortened
    began = time.monotonic()
    proc, runs, out = start(job, tmp_path, cluster)
    wait_for(lambda: "rank 1 step 12" in out.read_text(), 120, "step 12")
    kill_netns([cluster.hosts[0].netns])  # the master: the rendezvous must move
    code = finish(proc)
    wall = time.monotonic() - began
    text = out.read_text()
    assert code == 0, text[-4000:]
    assert "leaving node0 out of attempt 1 on: node0 lost" in text
    assert "spare node2 takes a place in the next attempt" in text
    resumed = re.search(r"attempt 1 rank 0 on node1 resumes at step (\d+); previous failure: attempt 0 at "
                        r"\d\d:\d\d:\d\d: node0 lost", text)
    assert resumed and int(resumed.group(1)) >= 10, text[-4000:]
    assert "run " in text and "succeeded after 2 attempt(s), 1 restart(s) of at most 2" in text
    summary = run_summary(runs)
    first, second = summary["attempts"]
    assert first["hosts"] == ["node0", "node1"] and first["failure"]["class"] == "host fault"
    assert second["hosts"] == ["node1", "node2"] and second["master"] == "node1" and second["exit_code"] == 0
    assert summary["excluded"][0]["host"] == "node0" and summary["exit_code"] == 0
    run_dir = next(runs.iterdir())
    assert (run_dir / "attempt-0" / "node1.log").read_text().count("step") >= 10
    assert "resumes at step" in (run_dir / "attempt-1" / "node2.log").read_text()
    assert json.loads((run_dir / "attempt-1" / "summary.json").read_text())["exit_code"] == 0
    wait_for(lambda: no_attempt_left(cluster, summary, [1, 2]), 30, "no job process left")
    assert_the_account_of_a_killed_host(text, run_dir, summary, wall, int(resumed.group(1)))


def assert_the_account_of_a_killed_host(text: str, run_dir: Path, summary: dict[str, Any], wall: float,
                                        resumed_at: int) -> None:
    """Its parts add up to the wall time; node0 is charged at least from its loss to the next
    attempt's first step; the re-done steps are those after the checkpoint the next attempt resumed."""
    account = summary["account"]
    assert text.rstrip().splitlines()[-1] == f"ddpctl: {account['line']}"
    assert re.match(r"goodput \d+ % \(\d+ s of \d+ s\): \d+ s to node0 \(lost: ", account["line"]), account["line"]
    parts = account["productive_s"] + sum(p["seconds"] for p in account["parts"])
    assert parts == pytest.approx(account["wall_s"], rel=0.02)
    assert account["wall_s"] == pytest.approx(wall, rel=0.02, abs=2.0)  # `up`'s own start-up is outside the run
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    lost = next(e["t"] for e in events if e["event"] == "lost" and e["host"] == "node0")
    resumed = next(e["t"] for e in events if e["event"] == "first step" and e["attempt"] == 1)
    assert account["hosts"]["node0"] >= resumed - lost
    assert {p["kind"] for p in account["parts"] if p["host"] == "node0"} >= {"fencing", "relaunch", "re-done"}
    redone = account["redone"]
    assert redone["known"] and abs(redone["since_step"] - resumed_at) <= 2, redone
    assert abs(redone["steps"] - (summary["attempts"][0]["steps"] - resumed_at)) <= 2, (redone, summary["attempts"])
    report = json.loads((run_dir / "attempt-1" / "report.json").read_text())
    assert report["account"]["line"] == account["line"]
    # the ledger has it: `ddpctl runs` lists the run, `ddpctl hosts` charges node0 its cost
    (listed,) = json.loads(run_ddpctl("runs", "--json").stdout)
    assert (listed["run_id"], listed["goodput"], listed["hosts"]) == (summary["run_id"], account["goodput"],
                                                                      account["hosts"])
    hosts = json.loads(run_ddpctl("hosts", "-i", str(run_dir.parents[1] / "hosts.toml"), "--json").stdout)
    cost = next(h["cost"] for h in hosts["hosts"] if h["name"] == "node0")
    assert cost == {"seconds": pytest.approx(account["hosts"]["node0"], abs=0.01), "runs": 1}


def test_host_fault_exit_code_and_a_spare_failing_the_checks_take_the_next_spare(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(4)
    # node2, the first spare, drops every TCP connection but SSH: the pre-launch probe fails there
    cluster.iptables(2, "-I", "INPUT", "-p", "tcp", "!", "--dport", str(cluster.port), "-j", "DROP")
    job = job_file(tmp_path, cluster, "exit-code", [12, 0.05, 4, 6, "node1", "75", "0"], spares=[2, 3],
                   restart="max_restarts = 1\nhost_fault_exit_codes = [75]")
    text, summary = up_to_its_end(job, tmp_path, cluster, 0)
    assert re.search(r"leaving node1 out of attempt 1 on: a rank exited with code 75, listed in "
                     r"\[restart\] host_fault_exit_codes", text), text[-4000:]
    assert re.search(r"leaving node2 out of attempt 1 on: failed the pre-launch check \[firewall\]", text), \
        text[-4000:]
    assert [a["hosts"] for a in summary["attempts"]] == [["node0", "node1"], ["node0", "node3"]]
    assert [e["host"] for e in summary["excluded"]] == ["node1", "node2"]
    assert summary["restarts"] == 1  # a spare failing its checks spends no restart
    wait_for(lambda: no_attempt_left(cluster, summary, [0, 1, 3]), 30, "no job process left")


def test_no_spare_shrinks_to_min_nodes_and_says_so(make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(3)
    job = job_file(tmp_path, cluster, "shrink", [10, 0.05, 4, 5, "node2", "75", "0"],
                   restart="max_restarts = 1\nmin_nodes = 2\nhost_fault_exit_codes = [75]")
    text, summary = up_to_its_end(job, tmp_path, cluster, 0)
    assert "no spare left: the job shrinks to 2 host(s) of 3 ([restart] min_nodes = 2)" in text
    assert [a["hosts"] for a in summary["attempts"]] == [["node0", "node1", "node2"], ["node0", "node1"]]
    wait_for(lambda: no_attempt_left(cluster, summary, [0, 1, 2]), 30, "no job process left")
    # the run's logs: every attempt on each host, each after its mark; ps and down know the run too
    logs = run_ddpctl("logs", summary["run_id"], "-i", str(tmp_path / "hosts.toml"), *ssh_args(cluster))
    assert logs.returncode == 0, logs.stderr
    marks = re.findall(r"^\[(node\d)\]\s+---- ddpctl: attempt (\d) \(job (\S+)\) ----$", logs.stdout, re.MULTILINE)
    assert sorted(marks) == sorted([("node0", "0", f"{summary['run_id']}.0"), ("node1", "0", f"{summary['run_id']}.0"),
                                    ("node2", "0", f"{summary['run_id']}.0"), ("node0", "1", f"{summary['run_id']}.1"),
                                    ("node1", "1", f"{summary['run_id']}.1")]), logs.stdout[-3000:]
    assert logs.stdout.index("---- ddpctl: attempt 0") < logs.stdout.index("---- ddpctl: attempt 1")


def test_a_deterministic_bug_is_retried_at_most_once(cluster2: Cluster, tmp_path: Path) -> None:
    # at step 0 on the first attempt: never retried
    job = job_file(tmp_path, cluster2, "bug-at-0", [10, 0.05, 3, 0, "node1", "raise", "all"])
    proc, runs, out = start(job, tmp_path, cluster2)
    assert finish(proc) == 70, out.read_text()[-4000:]
    assert "not restarting: the first attempt failed before any progress" in out.read_text()
    assert len(run_summary(runs)["attempts"]) == 1
    # at step 5, after a checkpoint at step 3: one restart resumes at 3 and fails the same way
    tmp = tmp_path / "later"
    tmp.mkdir()
    job = job_file(tmp, cluster2, "bug-at-5", [10, 0.05, 3, 5, "node1", "raise", "all"], restart="max_restarts = 5")
    text, summary = up_to_its_end(job, tmp, cluster2, 70)
    assert re.search(r"not restarting: attempt 1 failed exactly as attempt 0 after 2 optimizer step\(s\) of its "
                     r"own, with no new checkpoint: rank 1 on node1: ValueError: bad batch at step 5", text), \
        text[-4000:]
    assert [a["failure"]["class"] for a in summary["attempts"]] == ["error", "deterministic"]
    assert summary["exit_code"] == 70 and summary["restarts"] == 1
    wait_for(lambda: no_attempt_left(cluster2, summary, [0, 1]), 30, "no job process left")


def test_budget_spent_stops_non_zero_and_says_so(cluster2: Cluster, tmp_path: Path) -> None:
    job = job_file(tmp_path, cluster2, "budget", [10, 0.05, 100, 3, "node0", "raise-per-attempt", "all"],
                   restart="max_restarts = 1")
    text, summary = up_to_its_end(job, tmp_path, cluster2, 1)
    assert "restart budget spent: 1 of 1 restart(s) used; attempt 1 failed: rank 0 on node0: ValueError: flaky " \
           "read in attempt 1" in text
    assert len(summary["attempts"]) == 2 and summary["exit_code"] == 1
    wait_for(lambda: no_attempt_left(cluster2, summary, [0, 1]), 30, "no job process left")


def test_ctrl_c_in_a_backoff_stops_cleanly(cluster2: Cluster, tmp_path: Path) -> None:
    job = job_file(tmp_path, cluster2, "backoff", [10, 0.05, 100, 3, "node1", "raise", "0"],
                   restart="max_restarts = 3\nbackoff = 60")
    proc, runs, out = start(job, tmp_path, cluster2)
    wait_for(lambda: "restarting in 60s" in out.read_text(), 120, "the backoff")
    proc.send_signal(signal.SIGINT)
    code = finish(proc, 30)
    text = out.read_text()
    assert code == 130, text[-4000:]
    assert "stopped during the backoff, before attempt 1: nothing was running" in text
    summary = run_summary(runs)
    assert len(summary["attempts"]) == 1 and summary["stopped_because"].startswith("stopped during the backoff")
    wait_for(lambda: no_attempt_left(cluster2, summary, [0, 1]), 30, "no job process left")


def test_a_detached_job_is_restarted_from_its_first_host_and_down_ends_the_loop_first(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(3)
    job = job_file(tmp_path, cluster, "detached", [100000, 0.1, 5, -1, NEVER, "raise", "0"], spares=[2])
    runs = tmp_path / "runs"
    up = run_ddpctl("up", str(job), "--detach", "--runs-dir", str(runs), *ssh_args(cluster), cwd=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    found = re.search(r"the restart loop of run (\S+) runs on node0 \(pid (\d+)", up.stderr)
    assert found, up.stderr
    run_id = found.group(1)
    attempt0 = runs / run_id / "attempt-0" / "node1.log"
    wait_for(lambda: attempt0.exists() and "rank 1 step 6" in attempt0.read_text(), 120, "attempt 0 to train")
    kill_netns([cluster.hosts[1].netns])  # node1 goes; the loop on node0 restarts the job on node0 + node2
    attempt1 = runs / run_id / "attempt-1" / "node2.log"
    wait_for(lambda: attempt1.exists() and "rank 1 step" in attempt1.read_text(), 120, "attempt 1 to train")
    assert "attempt 1 rank 1 on node2 resumes at step" in attempt1.read_text()
    # someone stops the run: the loop goes first, so nothing restarts what `down` ends
    down = run_ddpctl("down", run_id, "-i", str(tmp_path / "hosts.toml"), *ssh_args(cluster), timeout=120)
    assert f"stopped restart loop of {run_id}" in down.stdout, down.stdout + down.stderr
    summary = wait_for(lambda: (runs / run_id / "summary.json").exists() and
                       json.loads((runs / run_id / "summary.json").read_text()), 60, "the run's summary")
    assert len(summary["attempts"]) == 2 and summary["signal"] == signal.SIGTERM, summary
    assert summary["excluded"][0]["host"] == "node1" and summary["exit_code"] == 128 + signal.SIGTERM
    wait_for(lambda: no_attempt_left(cluster, summary, [0, 2]), 30, "no job process left")
    assert not running(int(found.group(2)))  # the loop itself is gone


def test_a_link_down_for_good_is_lost_after_lost_after_and_a_spare_takes_over(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(3)
    job = job_file(tmp_path, cluster, "link-down", [30, 0.15, 5, -1, NEVER, "raise", "0"], spares=[2],
                   supervise="[supervise]\nlost_after = 10\n")  # the test waits on it: shortened
    proc, runs, out = start(job, tmp_path, cluster)
    wait_for(lambda: "rank 1 step 7" in out.read_text(), 120, "step 7")
    cluster.link_down(1)
    try:
        code = finish(proc)
        text = out.read_text()
        assert code == 0, text[-4000:]
        lost = r"leaving node1 out of attempt 1 on: node1 lost at \S+: no contact with node1 for 10s"
        assert re.search(lost, text), text[-4000:]
        summary = run_summary(runs)
        assert [a["hosts"] for a in summary["attempts"]] == [["node0", "node1"], ["node0", "node2"]]
        assert "attempt 1 rank 1 on node2 resumes at step" in text
        # fenced: node1, cut off, ends its own part when it stops hearing from `up` (1.5 x lost_after);
        # attempt 1 waited for that, dialling node1 all along
        assert re.search(r"fencing node1 before attempt 1: .* waiting up to \d+ s for it to stop its own ranks", text)
        assert "node1 not reached again; its own limit has passed" in text
        assert text.index("its own limit has passed") < text.index("attempt 1 rank 1 on node2 resumes")
        assert not cluster.job_pids(1, summary["attempts"][0]["job_id"])
        assert summary["attempts"][0]["fenced"][0]["how"] == "waited out"
        wait_for(lambda: no_attempt_left(cluster, summary, [0, 2]), 30, "no job process left")
        # its account: lost_after of silence is detection, then the fence's wait, all charged to node1
        charged = {p["kind"]: p["seconds"] for p in summary["account"]["parts"] if p["host"] == "node1"}
        assert charged["detection"] >= 8 and charged["fencing"] > 0, summary["account"]  # lost_after 10: its silence
        line = summary["account"]["line"]
        assert re.search(r"\d+ s to node1 \(lost: ", line) and " s detection" in line and " s fencing" in line, line
    finally:
        cluster.link_up(1)


def test_a_rank_killed_by_sigkill_is_a_host_fault(make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    """As the OOM killer does: one rank of node1 SIGKILLed; torchrun there reports exitcode -9."""
    cluster = make_cluster(3)
    job = job_file(tmp_path, cluster, "oom", [30, 0.15, 5, -1, NEVER, "raise", "0"], spares=[2])
    proc, runs, out = start(job, tmp_path, cluster)
    wait_for(lambda: "rank 1 step 7" in out.read_text(), 120, "step 7")
    run_id = next(runs.iterdir()).name
    argv = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in cluster.job_pids(1, f"{run_id}.0")}
    ranks = [pid for pid, args in argv.items()  # python -u rankwrap.py script ... (torchrun's argv names it too)
             if not args[1].endswith(b"torchrun") and any(a.endswith(b"rankwrap.py") for a in args[1:3])]
    assert ranks, "no rank process on node1"
    os.kill(ranks[0], signal.SIGKILL)
    code = finish(proc)
    text = out.read_text()
    assert code == 0, text[-4000:]
    assert re.search(r"leaving node1 out of attempt 1 on: a rank was killed \(SIGKILL", text), text[-4000:]
    summary = run_summary(runs)
    # the cause, not the peer's "connection reset": node1's torchrun (or supervisor) said what ended the rank
    assert summary["attempts"][0]["root_cause"].startswith("rank 1 on node1: SIGKILL: the rank was ended by SIGKILL")
    assert [a["hosts"] for a in summary["attempts"]] == [["node0", "node1"], ["node0", "node2"]]
    wait_for(lambda: no_attempt_left(cluster, summary, [0, 1, 2]), 30, "no job process left")
