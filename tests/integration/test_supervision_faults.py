"""The fault model on the real cluster (docs/running.md: "The fault model"): a control-plane blip
costs nothing, a host cut off or killed is named as lost and the job stops everywhere (on the
cut-off host too, while it is still cut off), and SIGTERM/SIGHUP stop `up` as Ctrl-C does. Every
test ends with no job process on any host."""

from __future__ import annotations

import re
import signal
import subprocess
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.cluster_sys import kill_netns
from tests.ddpctl_run import ddpctl_argv, no_job_processes, only_summary, ssh_args, wait_for, write_job

pytestmark = pytest.mark.cluster

# Real DDP traffic every step (gloo all_reduce between the hosts), one numbered line per step and
# rank; --flood makes the ranks of one node print about 1 MB/s besides.
STEPS = textwrap.dedent("""\
    import os, sys, threading, time
    import torch
    import torch.distributed as dist

    steps, delay, flood = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if flood >= 0 and int(os.environ["DDPCTL_NODE_RANK"]) == flood:
        def spam():
            line = "flood " + "x" * 990
            while True:
                for _ in range(100):
                    print(line)
                time.sleep(0.1)
        threading.Thread(target=spam, daemon=True).start()
    for step in range(steps):
        dist.all_reduce(torch.ones(4))
        print(f"rank {rank} step {step}", flush=True)
        time.sleep(delay)
    dist.destroy_process_group()
    """)
STEP_LINE = re.compile(r"^\[node\d+:(\d+)\]\s+rank (\d+) step (\d+)$")


def train(tmp_path: Path, cluster: Cluster, name: str, steps: int, delay: float, *, flood: int = -1,
          lost_after: int | None = None, until: str = "step 3") -> tuple[subprocess.Popen[str], Path, Path]:
    """`ddpctl up` of the STEPS job, started from Python (so that signals reach it as they reach a
    foreground process), once its output shows `until`: the process, the runs dir, its output."""
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    job = write_job(tmp_path, cluster, name, [str(steps), str(delay), str(flood)], script=script, nproc=1)
    if lost_after is not None:
        job.write_text(job.read_text() + f"[supervise]\nlost_after = {lost_after}\n")
    runs, out = tmp_path / "runs", tmp_path / f"{name}.out"
    proc = subprocess.Popen(ddpctl_argv("up", str(job), "--runs-dir", str(runs), "--grace", "3", *ssh_args(cluster)),
                            stdout=out.open("w"), stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: until in out.read_text(), 120, f"{until!r} in the output")
    return proc, runs, out


def wait_exit(proc: subprocess.Popen[str], timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def ssh_blocked(cluster: Cluster, i: int, on: bool) -> None:
    """Only SSH to and from host i: the job's own traffic between the hosts still flows."""
    flag = "-I" if on else "-D"
    cluster.iptables(i, flag, "INPUT", "-p", "tcp", "--dport", str(cluster.port), "-j", "DROP")
    cluster.iptables(i, flag, "OUTPUT", "-p", "tcp", "--sport", str(cluster.port), "-j", "DROP")


class Blips:
    """SSH cut off from some hosts, from now on, each for its own number of seconds (a timer ends
    each); `close()` ends the ones still on."""

    def __init__(self, cluster: Cluster, seconds: dict[int, float]) -> None:
        self.cluster = cluster
        self.on = set(seconds)
        self.lock = threading.Lock()
        for i in seconds:
            ssh_blocked(cluster, i, True)
        self.timers = [threading.Timer(s, self.end, (i,)) for i, s in seconds.items()]
        for timer in self.timers:
            timer.start()

    def end(self, i: int) -> None:
        with self.lock:
            if i in self.on:
                self.on.discard(i)
                ssh_blocked(self.cluster, i, False)

    def close(self) -> None:
        for timer in self.timers:
            timer.cancel()
        for i in list(self.on):
            self.end(i)


def step_lines(text: str) -> dict[int, list[int]]:
    seen: dict[int, list[int]] = {}
    for line in text.splitlines():
        m = STEP_LINE.match(line)
        if m:
            seen.setdefault(int(m.group(2)), []).append(int(m.group(3)))
    return seen


def test_control_plane_blips_of_20_and_45_seconds_cost_nothing(make_cluster: Callable[[int], Cluster],
                                                              tmp_path: Path) -> None:
    """The issue's two blips, at once on two hosts, with the default lost_after (60 s): the job
    runs through, each host is re-attached with one notice, and every line arrives once and in
    order. It waits about a minute because a 45 s blip is what it proves harmless."""
    cluster = make_cluster(3)
    steps = 300
    proc, runs, out = train(tmp_path, cluster, "blips", steps, 0.2)
    blips = Blips(cluster, {1: 20, 2: 45})
    try:
        code = wait_exit(proc, 195)
    finally:
        blips.close()
    text = out.read_text()
    assert code == 0, text[-3000:]
    for host in ("node1", "node2"):
        assert len(re.findall(rf"lost contact with {host} at \d\d:\d\d:\d\d", text)) == 1, text[-3000:]
        assert len(re.findall(rf"{host} back after \d+s", text)) == 1, text[-3000:]
    assert "node0 back" not in text and "lost contact with node0" not in text
    assert step_lines(text) == {rank: list(range(steps)) for rank in range(3)}  # none lost, none twice
    summary = only_summary(runs)
    logs = {h: (runs / summary["job_id"] / f"{h}.log").read_text() for h in ("node1", "node2")}
    assert all(log.count(" step 299\n") == 1 for log in logs.values())
    wait_for(lambda: no_job_processes(cluster, summary["job_id"]), 30, "no process of the job left")


def control_connection_port(cluster: Cluster, i: int) -> int:
    """This machine's port of its one SSH connection to host i (ddpctl keeps one per host)."""
    out = subprocess.run(["ss", "-Htn", "state", "established", "dst", f"{cluster.hosts[i].address}:{cluster.port}"],
                         capture_output=True, text=True, check=True).stdout.split()
    (local,) = [word for word in out if word.startswith(f"{cluster.bridge_address}:")]
    return int(local.rsplit(":", 1)[1])


def connection_blocked(cluster: Cluster, i: int, port: int, on: bool) -> None:
    """Only the one TCP connection from `port`: a fresh connection to host i gets through."""
    flag = "-I" if on else "-D"
    cluster.iptables(i, flag, "INPUT", "-p", "tcp", "--dport", str(cluster.port), "--sport", str(port), "-j", "DROP")
    cluster.iptables(i, flag, "OUTPUT", "-p", "tcp", "--sport", str(cluster.port), "--dport", str(port), "-j", "DROP")


def test_a_stuck_control_connection_is_replaced_and_the_output_resumes_where_it_stopped(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    """The old connection stays dead, a new one gets through: up re-attaches to node1's
    supervisor over it, and node1's output picks up at the last batch shown."""
    cluster = make_cluster(2)
    steps = 150
    proc, runs, out = train(tmp_path, cluster, "stuck", steps, 0.1)
    port = control_connection_port(cluster, 1)
    connection_blocked(cluster, 1, port, True)
    try:
        code = wait_exit(proc, 120)
    finally:
        connection_blocked(cluster, 1, port, False)
    text = out.read_text()
    assert code == 0, text[-3000:]
    assert re.search(r"lost contact with node1 at \d\d:\d\d:\d\d", text), text[-3000:]
    assert re.search(r"node1 back after \d+s: re-attached on a fresh connection", text), text[-3000:]
    assert step_lines(text) == {rank: list(range(steps)) for rank in range(2)}  # none lost, none twice
    wait_for(lambda: no_job_processes(cluster, only_summary(runs)["job_id"]), 30, "no process of the job left")


def test_a_host_cut_off_while_flooding_is_lost_and_stops_its_own_ranks(make_cluster: Callable[[int], Cluster],
                                                                       tmp_path: Path) -> None:
    cluster = make_cluster(2)
    proc, runs, out = train(tmp_path, cluster, "cutoff", 100000, 0.1, flood=1, lost_after=10, until="flood")
    job_id = next(runs.iterdir()).name
    cluster.link_down(1)
    try:
        code = wait_exit(proc, 60)
        text = out.read_text()
        assert code == 1, text[-3000:]
        assert re.search(r"first failure: node1 lost at \d\d:\d\d:\d\d: no contact with node1 for 10s", text), \
            text[-3000:]
        assert "first failure: rank" not in text
        wait_for(lambda: not cluster.job_pids(0, job_id), 30, "node0's job processes to end")
        # node1 hears no heartbeat: it ends its own ranks, link still down (how soon: bench/host_loss.py)
        wait_for(lambda: not cluster.job_pids(1, job_id), 30, "node1 to stop its own ranks while cut off")
    finally:
        cluster.link_up(1)
    summary = only_summary(runs)
    assert summary["first_failure"] == "node1" and summary["lost"]["host"] == "node1"


def test_a_host_killed_outright_is_named_lost_at_once(make_cluster: Callable[[int], Cluster],
                                                      tmp_path: Path) -> None:
    cluster = make_cluster(3)
    proc, runs, out = train(tmp_path, cluster, "killed", 100000, 0.1)
    job_id = next(runs.iterdir()).name
    kill_netns([cluster.hosts[2].netns])
    code = wait_exit(proc, 60)
    text = out.read_text()
    assert code == 1, text[-3000:]
    assert re.search(r"first failure: node2 lost at \d\d:\d\d:\d\d: connection to node2 lost: host or sshd died",
                     text), text[-3000:]
    assert "exit -1" not in text and "first failure: rank" not in text
    wait_for(lambda: not cluster.job_pids(0, job_id) and not cluster.job_pids(1, job_id), 30,
             "the other hosts' job processes to end")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["sigterm", "sighup"])
def test_sigterm_and_sighup_stop_the_job_everywhere_as_ctrl_c_does(cluster2: Cluster, tmp_path: Path,
                                                                   sig: signal.Signals) -> None:
    proc, runs, out = train(tmp_path, cluster2, f"signal-{sig.name.lower()}", 100000, 0.1)
    job_id = next(runs.iterdir()).name
    proc.send_signal(sig)
    code = wait_exit(proc, 60)
    text = out.read_text()
    assert code == 128 + sig, text[-3000:]
    assert f"got {sig.name}" in text and "stopping the job on every host, as Ctrl-C does" in text
    assert f"stopped on every host by {sig.name} (exit {128 + sig})" in text
    assert "node0 failed" not in text and "node1 failed" not in text
    summary = only_summary(runs)
    assert summary["signal"] == sig and summary["interrupted"] is True
    wait_for(lambda: no_job_processes(cluster2, job_id), 30, "no process of the job left")
