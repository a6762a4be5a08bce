"""From bare hosts to a first run, as docs/bare-hosts.md walks through it: two hosts that share no
filesystem (with this machine or each other) and let our key in only once `ddpctl ssh-setup` has used
their password to install it; then `ddpctl up` syncs the project there and runs real DDP over gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Cluster, require_cluster, start_cluster
from tests.ddpctl_run import ddpctl_argv, run_ddpctl

pytestmark = pytest.mark.cluster

TRAIN = """\
import socket
import torch
import torch.distributed as dist
from model import scale

dist.init_process_group("gloo")
t = torch.tensor([scale(dist.get_rank() + 1.0)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} on {socket.gethostname()}: sum={t.item():g}", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_cluster()
    with start_cluster(2, tmp_path_factory.mktemp("bare"), private=True, password_login=[0, 1]) as c:
        yield c


def write_project(cluster: Cluster, tmp_path: Path, key: Path) -> Path:
    """The user's side: an ssh_config naming the new key (not there yet), an inventory, a project."""
    config = tmp_path / "ssh_config"
    config.write_text("".join(
        f"Host {h.name}\n    HostName {h.address}\n    User root\n    IdentityFile {key}\n"
        f"    IdentitiesOnly yes\n    UserKnownHostsFile {cluster.known_hosts}\n" for h in cluster.hosts))
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hosts.toml").write_text(f'[defaults]\npython = {json.dumps(sys.executable)}\n' + "".join(
        f'[[hosts]]\nname = "{h.name}"\naddress = "{h.address}"\n' for h in cluster.hosts))
    (proj / "train.py").write_text(TRAIN)
    (proj / "model.py").write_text("def scale(x):\n    return 10 * x\n")
    (proj / "job.toml").write_text(
        'inventory = "hosts.toml"\n[job]\nname = "first"\nscript = "train.py"\nnproc_per_node = 1\n'
        '[rendezvous]\nmaster_port = "auto"\n[env]\nGLOO_SOCKET_IFNAME = "eth0"\n'
        '[sync]\ndest = "proj"\n')
    return proj


def test_password_only_hosts_without_shared_filesystem_to_a_synced_ddp_run(cluster: Cluster, tmp_path: Path) -> None:
    key = tmp_path / "keys" / "id_ed25519"
    proj = write_project(cluster, tmp_path, key)
    job = proj / "job.toml"
    ssh = ["--ssh-config", str(tmp_path / "ssh_config")]

    before = run_ddpctl("up", str(job), *ssh, "--runs-dir", str(tmp_path / "runs"))
    assert before.returncode == 1 and "node0" in before.stderr  # no key yet: the hosts refuse us

    setup = subprocess.run(ddpctl_argv("ssh-setup", str(job), "--key", str(key), "--password-stdin", *ssh),
                           input=cluster.test_password + "\n", capture_output=True, text=True, timeout=120)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert key.is_file() and (key.stat().st_mode & 0o777) == 0o600
    assert cluster.test_password not in setup.stdout + setup.stderr

    up = run_ddpctl("up", str(job), *ssh, "--runs-dir", str(tmp_path / "runs"), timeout=240)
    out = up.stdout + up.stderr
    assert up.returncode == 0, out
    for i in range(2):  # 10 * (1 + 2), computed by both ranks from the synced model.py
        assert f"rank {i}/2 on node{i}: sum=30" in out
        copy = cluster.run_in(i, ["cat", f"{cluster.root_home}/proj/model.py"])
        assert copy.returncode == 0 and "10 * x" in copy.stdout
    assert not Path(cluster.root_home, "proj").exists()  # nothing landed on this machine
    assert cluster.test_password not in out
