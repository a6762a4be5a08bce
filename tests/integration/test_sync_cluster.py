"""[sync] on hosts that share no filesystem with this machine (nor with each other): each host's
sshd runs in its own mount namespace with a private tmpfs over /srv, where its home is. The project goes
there over SFTP before any rank starts; run state and logs live in the host's private home."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Cluster, require_cluster, start_cluster
from tests.ddpctl_run import run_ddpctl, ssh_args, wait_for

pytestmark = pytest.mark.cluster
DEST = "/srv/proj"
ODD = "we i'rd $(touch PWNED); x.txt"  # SFTP takes no shell, but a file name must survive any path

TRAIN = """\
import os, socket, sys
sys.dont_write_bytecode = False  # the host's Python caches msg.py in __pycache__/, as by default
import torch.distributed as dist
import msg

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} on {socket.gethostname()} in {os.getcwd()}: {msg.MESSAGE}", flush=True)
assert not os.path.exists("data"), "data/ is excluded and must not reach the host"
for folder, name in (("outputs", f"rank{dist.get_rank()}.txt"), ("checkpoints", "last.pt")):
    os.makedirs(folder, exist_ok=True)  # what a job writes in its directory: the host's own
    with open(os.path.join(folder, name), "w") as f:
        f.write(f"written by rank {dist.get_rank()}\\n")
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_cluster()
    with start_cluster(2, tmp_path_factory.mktemp("sync-cluster"), private=True) as c:
        yield c


@pytest.fixture
def project(cluster: Cluster, tmp_path: Path) -> Iterator[Path]:
    """A project whose job file syncs it to /srv/proj on both hosts; both copies are removed after."""
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "pkg").mkdir()
    (proj / "train.py").write_text(TRAIN)
    (proj / "msg.py").write_text('MESSAGE = "v1"\n')
    (proj / "pkg" / "util.py").write_text("X = 1\n")
    (proj / "pkg" / ODD).write_text("odd\n")
    (proj / "data" / "big.bin").write_bytes(os.urandom(4096))
    (proj / "model.ckpt").write_text("checkpoint\n")
    (proj / ".gitignore").write_text("*.ckpt\n")
    (proj / ".git").mkdir()
    (proj / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    write_sync_job(cluster, proj, 'exclude = ["data/"]')
    yield proj
    for i in range(len(cluster.hosts)):
        cluster.run_in(i, ["rm", "-rf", DEST])


def write_sync_job(cluster: Cluster, proj: Path, sync_lines: str, dest: str = DEST) -> Path:
    job = proj / "job.toml"
    job.write_text(f"inventory = {json.dumps(str(cluster.hosts_toml))}\n"
                   '[job]\nname = "synced"\nscript = "train.py"\nnproc_per_node = 1\n'
                   '[rendezvous]\nmaster_port = "auto"\n[env]\nGLOO_SOCKET_IFNAME = "eth0"\n'
                   f"[sync]\ndest = {json.dumps(dest)}\n{sync_lines}\n")
    return job


def remote_files(cluster: Cluster, i: int, root: str = DEST) -> set[str]:
    """Every file under `root` on host i (its private mount namespace), relative to root, but the
    sync's records (.ddpctl-sync/)."""
    out = cluster.run_in(i, ["find", root, "-path", f"{root}/.ddpctl-sync", "-prune", "-o", "-type", "f",
                             "-printf", "%P\\n"])
    assert out.returncode == 0, out.stderr
    return {line for line in out.stdout.splitlines() if line}


def remote_text(cluster: Cluster, i: int, rel: str) -> str:
    out = cluster.run_in(i, ["cat", f"{DEST}/{rel}"])
    assert out.returncode == 0, out.stderr
    return out.stdout


def up(cluster: Cluster, job: Path, *extra: str) -> tuple[int, str]:
    out = run_ddpctl("up", str(job), "--runs-dir", str(job.parent / "runs"), *ssh_args(cluster), *extra,
                     timeout=240)
    return out.returncode, out.stdout + out.stderr


def test_hosts_share_no_filesystem(cluster: Cluster) -> None:
    """The premise: a file written on one host is seen neither on the other nor here."""
    assert cluster.run_in(0, ["sh", "-c", "echo mine > /srv/only-node0"]).returncode == 0
    try:
        assert cluster.run_in(0, ["cat", "/srv/only-node0"]).stdout == "mine\n"
        assert cluster.run_in(1, ["test", "-e", "/srv/only-node0"]).returncode == 1
        assert not Path("/srv/only-node0").exists()
    finally:
        cluster.run_in(0, ["rm", "-f", "/srv/only-node0"])


def test_up_syncs_then_runs_and_picks_up_a_change(cluster: Cluster, project: Path) -> None:
    job = project / "job.toml"
    code, out = up(cluster, job)
    assert code == 0, out
    assert "sync node0:" in out and "sync node1:" in out
    for i in range(2):
        assert f"rank {i} on node{i} in {DEST}: v1" in out
        files = remote_files(cluster, i)
        assert {"train.py", "msg.py", "pkg/util.py", f"pkg/{ODD}", ".gitignore", "job.toml"} <= files
        assert not any(f.startswith(("data/", ".git/")) or f.endswith(".ckpt") for f in files), files
        assert remote_text(cluster, i, f"pkg/{ODD}") == "odd\n"
    assert not Path(DEST).exists()  # nothing landed on this machine
    assert not (project / "pkg" / "PWNED").exists()

    before = (project / "msg.py").stat().st_mtime
    (project / "msg.py").write_text('MESSAGE = "v2"\n')  # the same size: only the mtime tells
    os.utime(project / "msg.py", (before + 2, before + 2))  # a later second, as an editor's save gives
    code, out = up(cluster, job)
    assert code == 0, out
    assert "1 file (15 B) sent" in out, out
    for i in range(2):
        assert f"rank {i} on node{i} in {DEST}: v2" in out
        assert remote_text(cluster, i, "msg.py") == 'MESSAGE = "v2"\n'


def test_sync_removes_deleted_files_and_keeps_excluded_ones(cluster: Cluster, project: Path) -> None:
    job = project / "job.toml"
    assert run_ddpctl("sync", str(job), *ssh_args(cluster)).returncode == 0
    for i in range(2):  # what the run wrote on the host, in excluded places
        assert cluster.run_in(i, ["sh", "-c", f"mkdir -p {DEST}/data && echo out > {DEST}/data/result "
                                              f"&& echo w > {DEST}/last.ckpt"]).returncode == 0
    (project / "pkg" / "util.py").unlink()
    shutil.rmtree(project / "pkg")
    out = run_ddpctl("sync", str(job), *ssh_args(cluster))
    assert out.returncode == 0, out.stderr
    for i in range(2):
        files = remote_files(cluster, i)
        assert not any(f.startswith("pkg/") for f in files), files
        assert cluster.run_in(i, ["test", "-e", f"{DEST}/pkg"]).returncode == 1  # the emptied directory too
        assert {"data/result", "last.ckpt", "train.py"} <= files  # excluded files are the host's own

    (project / "msg.py").unlink()
    write_sync_job(cluster, project, 'exclude = ["data/"]\ndelete = false')
    dry = run_ddpctl("sync", str(job), "--json", *ssh_args(cluster))
    assert dry.returncode == 0, dry.stderr
    assert all(h["removed"] == [] for h in json.loads(dry.stdout)["hosts"].values())
    assert all("msg.py" in remote_files(cluster, i) for i in range(2))


def test_sync_dry_run_changes_nothing(cluster: Cluster, project: Path) -> None:
    out = run_ddpctl("sync", str(project / "job.toml"), "--dry-run", "--json", *ssh_args(cluster))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    for name, host in report["hosts"].items():
        assert host["dry_run"] and "train.py" in host["sent"], (name, host)
    for i in range(2):
        assert cluster.run_in(i, ["test", "-e", DEST]).returncode == 1


def test_checksum_mode_sends_a_same_size_same_mtime_change(cluster: Cluster, project: Path) -> None:
    """size+mtime cannot see a change that keeps both; checksum = true can."""
    job = write_sync_job(cluster, project, 'exclude = ["data/"]\nchecksum = true')
    assert run_ddpctl("sync", str(job), *ssh_args(cluster)).returncode == 0
    st = (project / "msg.py").stat()
    (project / "msg.py").write_text('MESSAGE = "v9"\n')
    os.utime(project / "msg.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    out = run_ddpctl("sync", str(job), "--json", *ssh_args(cluster))
    assert out.returncode == 0, out.stderr
    assert all(h["sent"] == ["msg.py"] for h in json.loads(out.stdout)["hosts"].values())
    assert remote_text(cluster, 1, "msg.py") == 'MESSAGE = "v9"\n'


def test_doctor_script_checksum_agrees_after_sync(cluster: Cluster, project: Path) -> None:
    job = project / "job.toml"
    assert run_ddpctl("sync", str(job), *ssh_args(cluster)).returncode == 0
    out = run_ddpctl("doctor", str(job), "--json", *ssh_args(cluster))
    data = json.loads(out.stdout)
    workdir = {f["host"]: f for f in data["findings"] if f["check"] == "workdir"}
    assert {h: f["status"] for h, f in workdir.items()} == {"node0": "ok", "node1": "ok"}, workdir
    assert all("train.py identical on all hosts" in f["message"] for f in workdir.values())
    local = hashlib.sha256((project / "train.py").read_bytes()).hexdigest()
    for i in range(2):
        assert cluster.run_in(i, ["sha256sum", f"{DEST}/train.py"]).stdout.split()[0] == local

    (project / "train.py").write_text(TRAIN + "# edited, not synced\n")  # every host agrees, all stale
    data = json.loads(run_ddpctl("doctor", str(job), "--json", *ssh_args(cluster)).stdout)
    stale = {f["host"]: f for f in data["findings"] if f["check"] == "workdir" and f["status"] == "warn"}
    assert set(stale) == {"node0", "node1"}, data["findings"]
    assert all("differs from this machine's copy" in f["message"] and f"ddpctl sync {job}" in f["fix"]
               for f in stale.values())


def test_home_relative_dest_and_run_state_on_private_hosts(cluster: Cluster, project: Path) -> None:
    """dest "proj" is in each host's own (private) home; a detached run keeps its state there, and
    ps / logs / down find it."""
    job = write_sync_job(cluster, project, 'exclude = ["data/"]', dest="proj")
    (project / "train.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    ps_argv = ["ps", "-i", str(cluster.hosts_toml), "--job", "synced", "--json", *ssh_args(cluster)]
    code, out = up(cluster, job, "--detach")
    try:
        assert code == 0, out
        for i in range(2):
            assert "train.py" in remote_files(cluster, i, "/srv/root/proj")
        wait_for(lambda: run_ddpctl("logs", str(job), *ssh_args(cluster)).stdout.count("started") == 2, 60,
                 "both hosts' logs to show the rank's first line")
        ps = run_ddpctl(*ps_argv)
        assert ps.returncode == 0, ps.stderr
        assert {j["host"] for j in json.loads(ps.stdout)["jobs"]} == {"node0", "node1"}
        for i in range(2):  # each host's state is in its own home, not on this machine
            assert cluster.run_in(i, ["sh", "-c", "ls /srv/root/.ddpctl/runs/*/node*/state.json"]).returncode == 0
        assert not [p for p in Path("/root/.ddpctl/runs").glob("*/node*/state.json")
                    if json.loads(p.read_text()).get("job_name") == "synced"]
    finally:
        down = run_ddpctl("down", str(job), "--grace", "3", *ssh_args(cluster))
        for i in range(2):
            cluster.run_in(i, ["rm", "-rf", "/srv/root/proj"])
    assert down.returncode == 0, down.stdout + down.stderr
    assert json.loads(run_ddpctl(*ps_argv).stdout)["jobs"] == []


def test_a_host_that_cannot_take_the_copy_stops_the_launch(cluster: Cluster, project: Path) -> None:
    assert cluster.run_in(1, ["sh", "-c", f"echo not-a-dir > {DEST}"]).returncode == 0
    code, out = up(cluster, project / "job.toml")
    assert code == 1, out
    assert "node1" in out and "is not a directory" in out
    assert "rank 0 on" not in out  # no rank started anywhere
    assert not list((project / "runs").glob("*/summary.json"))


def test_a_first_copy_of_many_files_lands_whole_on_every_host(cluster: Cluster, project: Path) -> None:
    """Past BUNDLE_MIN_FILES the files travel as one tar over SFTP and the node agent lands them."""
    many = {f"gen/m{i:03d}.py": f"X = {i}  # {'é' * (i % 5)}\n" for i in range(120)}
    for rel, text in many.items():
        (project / rel).parent.mkdir(exist_ok=True)
        (project / rel).write_text(text)
    os.chmod(project / "gen" / "m007.py", 0o700)
    out = run_ddpctl("sync", str(project / "job.toml"), "--json", *ssh_args(cluster))
    assert out.returncode == 0, out.stderr
    assert all(len(h["sent"]) > 120 for h in json.loads(out.stdout)["hosts"].values())
    for i in range(2):
        files = remote_files(cluster, i)
        assert set(many) <= files and not [f for f in files if "ddpctl" in f], files  # no bundle, no temp file
        sums = cluster.run_in(i, ["sh", "-c", f"cd {DEST} && cat gen/*.py | sha256sum"]).stdout.split()[0]
        assert sums == hashlib.sha256("".join(many[k] for k in sorted(many)).encode()).hexdigest()
        mode = cluster.run_in(i, ["stat", "-c", "%a", f"{DEST}/gen/m007.py"]).stdout.strip()
        assert mode == "700"
    again = run_ddpctl("sync", str(project / "job.toml"), "--json", *ssh_args(cluster))
    assert all(h["sent"] == [] for h in json.loads(again.stdout)["hosts"].values())  # mtimes came along


def sync(cluster: Cluster, job: Path) -> tuple[int, str]:
    out = run_ddpctl("sync", str(job), "--runs-dir", str(job.parent / "runs"), *ssh_args(cluster))
    return out.returncode, out.stdout + out.stderr


def test_what_the_job_wrote_survives_later_syncs_and_what_the_source_dropped_goes(
        cluster: Cluster, project: Path) -> None:
    job = project / "job.toml"
    code, out = up(cluster, job)
    assert code == 0, out
    made = {}
    for i in range(2):  # the job's checkpoint and outputs, and the host's Python's bytecode cache
        files = remote_files(cluster, i)
        pyc = [f for f in files if f.startswith("__pycache__/msg.") and f.endswith(".pyc")]
        assert {"checkpoints/last.pt", f"outputs/rank{i}.txt"} <= files and pyc, files
        made[i] = {"checkpoints/last.pt", f"outputs/rank{i}.txt", *pyc}
        assert "pkg/util.py" in files
    (project / "pkg" / "util.py").unlink()
    code, out = sync(cluster, job)
    assert code == 0, out
    for i in range(2):
        assert f"sync node{i}: 1 removed" in out and "removed 1 file no longer in the source: pkg/util.py" in out, out
        assert f"kept {len(made[i])} files the host made" in out, out
    for _ in range(3):
        code, out = sync(cluster, job)
        assert code == 0 and out.count("up to date") == 2, out
    for i in range(2):
        files = remote_files(cluster, i)
        assert made[i] <= files and "pkg/util.py" not in files, files
        assert remote_text(cluster, i, "checkpoints/last.pt") == f"written by rank {i}\n"
        record = cluster.run_in(i, ["sh", "-c", f"cat {DEST}/.ddpctl-sync/*.json"])
        assert json.loads(record.stdout)["source"] == str(project), record.stdout


def read_only(cluster: Cluster, i: int, path: str) -> None:
    """A read-only bind mount of `path` over itself, in host i's own mount namespace only."""
    done = cluster.run_in(i, ["sh", "-c", f"mkdir -p {path} && mount --bind {path} {path} && "
                                          f"mount -o remount,ro,bind {path}"])
    assert done.returncode == 0, done.stderr


def test_a_read_only_target_is_named_with_the_host_the_path_and_the_os_error(
        cluster: Cluster, project: Path) -> None:
    job = project / "job.toml"
    assert sync(cluster, job)[0] == 0
    read_only(cluster, 1, DEST)
    try:
        current = sync(cluster, job)  # an up-to-date copy needs no write
        (project / "msg.py").write_text('MESSAGE = "version 3"\n')  # other sizes: seen whatever the mtimes
        (project / "pkg" / "util.py").write_text("X = 22\n")
        code, out = sync(cluster, job)
    finally:
        cluster.run_in(1, ["umount", DEST])
    assert current[0] == 0 and "sync node1: up to date" in current[1], current[1]
    assert code == 1, out
    assert f"node1: cannot write to {DEST}: Read-only file system" in out, out
    assert "Failure" not in out and "fix: remount the filesystem of" in out, out
    assert remote_text(cluster, 0, "msg.py") == 'MESSAGE = "version 3"\n'  # the other host took it

    read_only(cluster, 1, f"{DEST}/pkg")  # the copy's root can be written: SFTP fails at pkg/util.py
    try:
        code, out = sync(cluster, job)
    finally:
        cluster.run_in(1, ["umount", f"{DEST}/pkg"])
    assert code == 1, out
    assert f"node1: cannot write to {DEST}/pkg: Read-only file system" in out and "Failure" not in out, out


def test_a_full_target_is_named_before_anything_is_sent(cluster: Cluster, project: Path) -> None:
    mounted = cluster.run_in(1, ["sh", "-c", f"mkdir -p {DEST} && mount -t tmpfs -o size=64k ddpctl-full {DEST}"])
    assert mounted.returncode == 0, mounted.stderr
    (project / "weights.bin").write_bytes(os.urandom(256 << 10))
    try:
        code, out = sync(cluster, project / "job.toml")
        left = remote_files(cluster, 1)
    finally:
        cluster.run_in(1, ["umount", DEST])
    assert code == 1, out
    assert re.search(rf"node1: cannot write to {DEST}: No space left on device \(25\d KiB to send, 64 KiB "
                     r"free\)", out), out
    assert left == set()  # refused before anything went
    assert "weights.bin" in remote_files(cluster, 0)
