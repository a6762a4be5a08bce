"""`ddpctl up` on a real Slurm cluster (slurmctld + one slurmd per network namespace): the same
job file, one torchrun per node through srun, live output per node and rank, fail fast, Ctrl-C,
detach/ps/logs/down, requeue with a resumed checkpoint, a login node over SSH, two jobs on one
head node. The nodes share this filesystem, so `[slurm] python` is this interpreter."""

from __future__ import annotations

import json
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.ddpctl_run import wait_for
from tests.slurm_cluster import SlurmCluster
from tests.slurm_run import (
    active_jobs,
    ddpctl,
    env_for,
    job_processes,
    rank_lines,
    release_requeued,
    slurm_job,
    slurm_record,
    start_up,
    summary,
)

REPO = Path(__file__).resolve().parents[2]
TRICKY_ARGS = ["a b", "it's", '"quoted"', "$(touch /tmp/ddpctl-pwned)", "; echo injected", "`id`"]

SHOW = """\
import os, socket, sys
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank={dist.get_rank()} world={dist.get_world_size()} local={os.environ['LOCAL_RANK']} "
      f"host={socket.gethostname()} args={sys.argv[1:]!r} secret={os.environ.get('API_TOKEN')}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""

FAIL = """\
import time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 3:
    raise ValueError("rank 3 cannot go on")
time.sleep(300)
"""

SLEEP = """\
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank={dist.get_rank()} ready", flush=True)
if os.fork() == 0:  # a double-forked straggler: Slurm's proctrack/cgroup must end it too
    os.setsid()
    time.sleep(300)
    os._exit(0)
time.sleep(300)
"""

# Waits (bounded) until both concurrent jobs are running, so that they overlap on the head node.
OVERLAP = """\
import os, sys, time
from pathlib import Path
import torch.distributed as dist
dist.init_process_group("gloo")
meet = Path(sys.argv[1])
(meet / os.environ["DDPCTL_JOB_ID"]).touch()
deadline = time.monotonic() + 60
while len(list(meet.iterdir())) < 2 and time.monotonic() < deadline:
    time.sleep(0.1)
print(f"rank={dist.get_rank()} world={dist.get_world_size()} met={len(list(meet.iterdir()))}", flush=True)
dist.barrier()
"""


def test_two_nodes_two_ranks_each_verbatim_args_and_env_off_the_command_line(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = slurm_job(tmp_path, "show", SHOW, TRICKY_ARGS, env={"API_TOKEN": "s3cret-token"})
    textfiles = tmp_path / "textfiles"  # [slurm.metrics]: each node's series for node_exporter
    textfiles.mkdir()
    metrics = f"metrics = {{ textfile_dir = {json.dumps(str(textfiles))} }}\n"
    job.write_text(job.read_text().replace("[slurm]\n", f"[slurm]\n{metrics}") + "[metrics]\nkeep_ended = 30\n")
    proc = ddpctl(slurm_cluster, "up", str(job), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = rank_lines(proc.stdout)
    assert sorted(ranks) == [0, 1, 2, 3], proc.stdout[-3000:]
    for rank, line in ranks.items():
        assert "world=4" in line and f"args={TRICKY_ARGS!r}" in line and "secret=s3cret-token" in line
        assert line.startswith(f"[node{rank // 2}:")  # c10d's node ranks follow Slurm's task order here
    hosts = {re.search(r"host=(\S+)", line).group(1) for line in ranks.values()}  # type: ignore[union-attr]
    assert hosts == set(slurm_cluster.nodes)
    assert not Path("/tmp/ddpctl-pwned").exists()
    # the per-run log directory and summary, as the SSH backend keeps them
    data = summary(tmp_path)
    assert data["exit_code"] == 0 and {h["host"] for h in data["hosts"]} == {"node0", "node1"}
    assert "rank=0 world=4" in (tmp_path / "runs" / data["job_id"] / "node0.log").read_text()
    # the job env is in a 0600 request file, never in the batch script (nor on any command line)
    state = Path(slurm_record(tmp_path)["state_dir"])
    script = (state / "job.sbatch").read_text()
    assert "s3cret-token" not in script and "API_TOKEN" not in script
    request = state / "node.in"
    assert stat.S_IMODE(request.stat().st_mode) == 0o600 and b"s3cret-token" in request.read_bytes()
    assert "submitted Slurm job" in proc.stderr and f"node0 is {slurm_cluster.nodes[0]}" in proc.stderr
    assert slurm_record(tmp_path)["node_names"] == {f"node{i}": n for i, n in enumerate(slurm_cluster.nodes)}
    ended = {f.name: f.read_text() for f in textfiles.glob("ddpctl-*.prom")}  # kept 30 s, saying the job ended
    assert sorted(ended) == [f"ddpctl-{data['job_id']}-node{i}.prom" for i in range(2)], ended
    for text in ended.values():
        assert re.search(r'^ddpctl_job_running\{Hostname="[^"]+",job_name="show",.*\} 0$', text, re.M), text
        assert re.search(r"^ddpctl_job_exit_code\{.*\} 0$", text, re.M), text


def test_a_failing_rank_ends_the_job_on_every_node_and_is_named(slurm_cluster: SlurmCluster,
                                                                 tmp_path: Path) -> None:
    job = slurm_job(tmp_path, "fail", FAIL)
    proc = ddpctl(slurm_cluster, "up", str(job), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"first failure: rank 3 on node1 = {slurm_cluster.nodes[1]}" in proc.stderr
    assert "ValueError: rank 3 cannot go on" in proc.stderr
    data = summary(tmp_path)
    assert {h["host"]: h["hostname"] for h in data["hosts"]} == {"node0": slurm_cluster.nodes[0],
                                                                 "node1": slurm_cluster.nodes[1]}
    root = data["root_cause"]
    assert root["host"] == "node1" and root["error"]["rank"] == 3 and root["error"]["kind"] == "ValueError"
    assert job_processes(slurm_cluster) == {}  # rank 0-2 slept for 300 s: --kill-on-bad-exit ended them
    assert active_jobs(slurm_cluster) == []


def test_ctrl_c_cancels_the_job_and_leaves_no_process_on_any_node(slurm_cluster: SlurmCluster,
                                                                  tmp_path: Path) -> None:
    job = slurm_job(tmp_path, "sleepy", SLEEP)
    out = tmp_path / "up.out"
    proc = start_up(slurm_cluster, job, tmp_path, out)
    try:
        wait_for(lambda: out.read_text().count(" ready") >= 4, 90, "every rank ready")
        assert len(job_processes(slurm_cluster)) == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    assert "interrupted: stopping the job on every host" in text
    # `up` returned only once Slurm had ended the job: nothing of it is left, the straggler included
    assert active_jobs(slurm_cluster) == []
    left = job_processes(slurm_cluster)
    assert all(name == "slurmstepd" for names in left.values() for name in names), left
    wait_for(lambda: job_processes(slurm_cluster) == {}, 30, "the step daemons to exit")
    assert summary(tmp_path)["exit_code"] == 130


def test_detach_then_ps_logs_and_down(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = slurm_job(tmp_path, "detached", SLEEP)
    up = ddpctl(slurm_cluster, "up", str(job), "--detach", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    record = slurm_record(tmp_path)
    slurm_id, job_id = record["slurm_job_id"], record["job_id"]
    assert f"submitted Slurm job {slurm_id}" in up.stderr

    def ps() -> Any:
        out = ddpctl(slurm_cluster, "ps", "--backend", "slurm", "--json", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["jobs"]

    running = wait_for(lambda: [j for j in ps() if j["slurm_job_id"] == slurm_id and j["state"] == "RUNNING"],
                       60, "the job to run")
    assert running[0]["job_id"] == job_id
    plain = ddpctl(slurm_cluster, "ps", cwd=tmp_path)  # no --backend: Slurm's client is configured here
    assert plain.returncode == 0, plain.stderr
    assert any(slurm_id in line and job_id[:12] in line for line in plain.stdout.splitlines()), plain.stdout

    def logs() -> str:
        out = ddpctl(slurm_cluster, "logs", str(job), cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        return out.stdout

    text = wait_for(lambda: (lambda t: t if t.count(" ready") >= 4 else "")(logs()), 90, "every rank's line in logs")
    assert re.search(r"^\[node0\] \[default0\]:rank=\d ready", text, re.MULTILINE), text

    stacks = ddpctl(slurm_cluster, "stacks", str(job), "--json", cwd=tmp_path)
    assert stacks.returncode == 0, stacks.stderr + stacks.stdout
    report = json.loads(stacks.stdout)
    assert report["host_errors"] == {} and report["job"] == job_id
    assert {r["rank"] for g in report["groups"] for r in g["ranks"]} == {0, 1, 2, 3}

    down = ddpctl(slurm_cluster, "down", slurm_id, "--backend", "slurm", cwd=tmp_path)
    assert down.returncode == 0, down.stderr
    assert f"cancelled Slurm job {slurm_id} ({job_id})" in down.stdout
    assert active_jobs(slurm_cluster) == []
    assert not any(j["slurm_job_id"] == slurm_id for j in ps())
    again = ddpctl(slurm_cluster, "down", str(job), cwd=tmp_path)
    assert again.returncode == 1 and "no ddpctl Slurm job" in again.stderr
    # logs of the finished job are still there (the files on the cluster, no accounting needed)
    assert logs().count(" ready") >= 4


def test_submitted_through_a_login_node_over_ssh_without_slurm_config_here(slurm_cluster: SlurmCluster,
                                                                           tmp_path: Path) -> None:
    job = slurm_job(tmp_path, "viallogin", SHOW, ["x y"], slurm={"login": slurm_cluster.login_alias})
    here = subprocess.run(["sinfo"], capture_output=True, text=True, env=env_for(slurm_cluster, login=True),
                          check=False)
    assert here.returncode != 0  # this side cannot talk to Slurm by itself
    proc = ddpctl(slurm_cluster, "up", str(job), "--ssh-config", str(slurm_cluster.ssh_config), cwd=tmp_path,
                  login=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"on login node {slurm_cluster.login_alias}" in proc.stderr
    assert sorted(rank_lines(proc.stdout)) == [0, 1, 2, 3]
    # ps and down go through the login node too
    ps = ddpctl(slurm_cluster, "ps", "--backend", "slurm", "--login", slurm_cluster.login_alias,
                "--ssh-config", str(slurm_cluster.ssh_config), cwd=tmp_path, login=True)
    assert ps.returncode == 0 and "no ddpctl jobs" in ps.stdout, ps.stderr


def test_two_concurrent_jobs_on_one_head_node_get_their_own_rendezvous(slurm_cluster: SlurmCluster,
                                                                        tmp_path: Path) -> None:
    meet = tmp_path / "meet"
    meet.mkdir()
    outs, procs = [], []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        job = slurm_job(tmp_path / name, name, OVERLAP, [str(meet)], nproc=1, slurm={"cpus_per_task": 1})
        outs.append(tmp_path / f"{name}.out")
        procs.append(start_up(slurm_cluster, job, job.parent, outs[-1]))
    try:
        codes = [p.wait(180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    texts = [o.read_text() for o in outs]
    assert codes == [0, 0], texts
    ports = []
    for text in texts:
        assert "met=2" in text and "world=2" in text  # they overlapped, each with its own two ranks
        m = re.search(r"rendezvous (\S+):(\d+)", text)
        assert m is not None, text
        ports.append((m.group(1), m.group(2)))
    assert ports[0][0] == ports[1][0] == slurm_cluster.nodes[0]  # one head node
    assert ports[0][1] != ports[1][1]  # two stores


def test_dry_run_prints_the_batch_script_with_secrets_masked(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = slurm_job(tmp_path, "dry", SHOW, slurm={"partition": "debug", "time": "00:05:00"},
                    env={"API_TOKEN": "s3cret-token"})
    proc = ddpctl(slurm_cluster, "up", str(job), "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=debug" in proc.stdout and "#SBATCH --time=00:05:00" in proc.stdout
    assert "srun --kill-on-bad-exit=1" in proc.stdout and "API_TOKEN=***" in proc.stdout
    assert "s3cret-token" not in proc.stdout + proc.stderr
    assert active_jobs(slurm_cluster) == []  # nothing submitted


def test_requeue_before_the_time_limit_resumes_from_the_checkpoint(slurm_cluster: SlurmCluster,
                                                                   tmp_path: Path) -> None:
    """The time-limit warning (sent here by hand: `scancel --signal=USR1 --batch`, what
    `--signal=B:USR1@90` does) reaches every rank as a Python signal; image_classifier checkpoints,
    the job requeues itself, and its rerun resumes from the checkpoint, with `up` attached throughout."""
    train = REPO / "train_jobs" / "image_classifier" / "train.py"
    args = ["--epochs", "6", "--width", "4", "--train-size", "768", "--test-size", "64", "--batch-size", "32",
            "--checkpoint-dir", str(tmp_path / "ckpt")]
    lines = ["[job]", 'name = "requeued"', f"script = {json.dumps(str(train))}", f"args = {json.dumps(args)}",
             "nproc_per_node = 1", "[slurm]", "nodes = 2", f"python = {json.dumps(sys.executable)}",
             "requeue = true", "[env]", 'GLOO_SOCKET_IFNAME = "eth0"']
    job = tmp_path / "requeued.toml"
    job.write_text("\n".join(lines) + "\n")
    out = tmp_path / "up.out"
    proc = start_up(slurm_cluster, job, tmp_path, out)
    try:
        wait_for(lambda: re.search(r"\]\s+epoch=\d", out.read_text()), 120, "the first epoch")
        slurm_id = slurm_record(tmp_path)["slurm_job_id"]
        assert slurm_cluster.slurm("scancel", "--signal=USR1", "--batch", slurm_id).returncode == 0
        release_requeued(slurm_cluster, slurm_id)
        assert proc.wait(240) == 0, out.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    saved = re.search(r"preempted: checkpoint saved at epoch=(\d+)", text)
    resumed = re.search(r"resumed from checkpoint at epoch=(\d+) \(restart 1\)", text)
    assert saved and resumed, text[-4000:]
    assert saved.group(1) == resumed.group(1)
    assert "got SIGUSR1: passing it to the ranks, then requeueing" in text
    assert "run 0 ended" in text and "run 1 after requeue" in text
    assert re.search(r"final acc=\S+ loss=\S+ epochs=6", text), text[-2000:]
    assert summary(tmp_path)["exit_code"] == 0
    assert active_jobs(slurm_cluster) == []


def test_the_python_api_runs_a_slurm_job_and_backend_ssh_runs_it_here(
        slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator import up
    from orchestrator.launch.observer import Collected

    monkeypatch.setenv("SLURM_CONF", slurm_cluster.client_env["SLURM_CONF"])
    job = slurm_job(tmp_path, "api", SHOW, ["x"], nproc=1)
    seen = Collected()
    result = up(job, observer=seen, runs_dir=tmp_path / "runs")
    assert result.ok, seen.notices
    assert sorted(text.split()[0] for _, _, text in seen.lines if text.startswith("rank=")) == ["rank=0", "rank=1"]
    assert any(n.startswith("submitted Slurm job") for n in seen.notices)
    assert {h.host for h in result.hosts} == {"node0", "node1"}
    # the same job file over SSH: this machine (the embedded localhost inventory), no Slurm at all
    here = Collected()
    local = up(job, backend="ssh", observer=here, runs_dir=tmp_path / "runs-ssh",
               env={"GLOO_SOCKET_IFNAME": "lo"})
    assert local.ok, here.notices
    assert [h.host for h in local.hosts] == ["localhost"]
    assert not any("Slurm" in n for n in here.notices)


def test_a_firewalled_rendezvous_is_diagnosed_by_a_probe_inside_the_allocation(slurm_cluster: SlurmCluster,
                                                                               tmp_path: Path) -> None:
    """The head node drops the rendezvous port range from outside: node1's torchrun never joins.
    The watchdog fires, doctor's probe runs in the job's own allocation (srun --overlap), dials the
    job's store and names the block; the job is cancelled."""
    c = slurm_cluster
    rule = ["INPUT", "-i", "eth0", "-p", "tcp", "--dport", "29500:30700", "-j", "DROP"]
    head = f"--net=/run/netns/{c.node_netns(0)}"
    subprocess.run(["nsenter", head, "iptables", "-I", *rule], check=True, timeout=30)
    try:
        job = slurm_job(tmp_path, "walled", SHOW)
        proc = ddpctl(c, "up", str(job), "--join-timeout", "8", cwd=tmp_path, timeout=240)
    finally:
        subprocess.run(["nsenter", head, "iptables", "-D", *rule], check=True, timeout=30)
    assert proc.returncode == 1, proc.stderr[-3000:]
    cause = summary(tmp_path)["cause"]
    assert cause is not None and "did not all join within 8s" in cause, cause
    assert "could not re-probe" not in cause, cause
    m = re.search(rf"node1 -> node0 {c.nodes[0]}:(\d+): timeout", cause)
    assert m is not None and f"TCP on the master port {m.group(1)} is blocked" in cause, cause
    assert f"torchrun's rendezvous at {c.nodes[0]}:{m.group(1)} never completed" in cause, cause
    assert active_jobs(c) == []
    assert job_processes(c) == {} or all(n == "slurmstepd" for ns in job_processes(c).values() for n in ns)


HANG = """\
import time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank={dist.get_rank()} ready", flush=True)
def wait_forever():
    time.sleep(300)
wait_forever()
"""


def test_a_silent_job_gets_every_ranks_stack_from_inside_the_allocation(slurm_cluster: SlurmCluster,
                                                                        tmp_path: Path) -> None:
    job = slurm_job(tmp_path, "hang", HANG)
    # silence for longer than each rank's `import torch` takes on these shared cores (≈5 s, more
    # under load): the dump must find every rank waiting, not still importing
    proc = ddpctl(slurm_cluster, "up", str(job), "--hang-timeout", "20", "--on-hang", "stop", cwd=tmp_path,
                  timeout=240)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "stacks of every rank (hang)" in proc.stderr
    run_dir = tmp_path / "runs" / summary(tmp_path)["job_id"]
    (dump,) = list(run_dir.glob("stacks-hang-*.json"))
    report = json.loads(dump.read_text())
    assert report["host_errors"] == {}, report["host_errors"]
    ranks = sorted(r["rank"] for g in report["groups"] for r in g["ranks"])
    assert ranks == [0, 1, 2, 3]
    (group,) = report["groups"]  # every rank waits in the same place
    assert [f["name"] for f in group["frames"]][:2] == ["wait_forever", "<module>"]
    assert {r["host"] for r in group["ranks"]} == {"node0", "node1"}
    assert active_jobs(slurm_cluster) == []
