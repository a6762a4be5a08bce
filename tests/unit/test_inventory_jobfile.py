"""Job files: defaults, host selection order, master resolution, overrides, located errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from job_dir import write_job

from inventory import (
    LOCALHOST,
    ConfigError,
    HostNproc,
    JobOverrides,
    apply_overrides,
    load_job,
    parse_env_assignment,
)
from inventory.model import MetricsSpec


def line_of(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


def test_full_job(cluster: Path) -> None:
    path = write_job(
        cluster,
        """\
        inventory = "hosts.toml"
        [job]
        name = "toy"
        script = "train.py"
        args = ["--epochs", "3"]
        nproc_per_node = 2
        hosts = ["node2", "node0"]
        [rendezvous]
        master_port = 29521
        backend = "c10d"
        [env]
        NCCL_DEBUG = "INFO"
        """,
    )
    job = load_job(path)
    assert job.name == "toy"
    assert job.script == "train.py" and job.module is None
    assert job.args == ("--epochs", "3")
    assert job.nproc_per_node == 2
    assert [h.name for h in job.hosts] == ["node2", "node0"]  # node_rank order as written
    assert job.inventory.names() == ["node0", "node1", "node2"]
    assert (job.rendezvous.master_port, job.rendezvous.backend) == (29521, "c10d")
    assert job.master_address == "198.18.0.12"  # first selected host
    assert job.master_host.name == "node2"
    assert dict(job.env) == {"NCCL_DEBUG": "INFO"}
    assert job.source == path
    assert job.base_dir == cluster.resolve()
    assert job.workdir_for(job.hosts[0]) == str(cluster.resolve())


def test_local_default_when_inventory_omitted(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("", encoding="utf-8")
    job = load_job(write_job(tmp_path, '[job]\nscript = "train.py"\n', name="my toy.toml"))
    assert job.inventory.source is None
    assert job.hosts == (LOCALHOST,)
    assert job.hosts[0].python == sys.executable
    assert job.name == "my-toy"  # from the file stem, made safe for a rendezvous id
    assert job.nproc_per_node is None  # not set: each host's slots decide, else 1
    assert job.nproc_of(job.hosts[0]) == HostNproc(1, "default")
    assert (job.rendezvous.master_addr, job.rendezvous.master_port) == (None, 29500)
    assert job.rendezvous.backend == "static"
    assert job.master_address == "127.0.0.1"
    assert job.args == () and dict(job.env) == {}


@pytest.mark.parametrize(
    ("hosts_line", "master_line", "names", "master_address"),
    [
        ("", "", ["node0", "node1", "node2"], "198.18.0.10"),
        ('hosts = ["node1"]', "", ["node1"], "198.18.0.11"),
        ('hosts = ["node[1-2]"]', 'master_addr = "node1"', ["node1", "node2"], "198.18.0.11"),
        (
            'hosts = ["198.18.0.12", "node0"]',
            'master_addr = "node2"',
            ["node2", "node0"],
            "198.18.0.12",
        ),
        ('hosts = ["node0"]', 'master_addr = "198.18.0.10"', ["node0"], "198.18.0.10"),
        ('hosts = ["node0"]', 'master_addr = "198.19.0.1"', ["node0"], "198.19.0.1"),
    ],
)
def test_selection_and_master(
    cluster: Path, hosts_line: str, master_line: str, names: list[str], master_address: str
) -> None:
    text = (
        f'inventory = "hosts.toml"\n[job]\nscript = "train.py"\n{hosts_line}\n'
        f"[rendezvous]\n{master_line}\n"
    )
    job = load_job(write_job(cluster, text))
    assert [h.name for h in job.hosts] == names
    assert job.master_address == master_address


def test_c10d_master_may_be_any_selected_host(cluster: Path) -> None:
    text = (
        'inventory = "hosts.toml"\n[job]\nscript = "train.py"\nhosts = ["node0", "node1"]\n'
        '[rendezvous]\nmaster_addr = "node1"\nbackend = "c10d"\n'
    )
    job = load_job(write_job(cluster, text))
    assert job.master_host.name == "node1"
    assert job.master_address == "198.18.0.11"


def test_inventory_path_relative_to_job_file_and_hostfile(cluster: Path) -> None:
    (cluster / "hostfile").write_text("node0 slots=2\nnode1 slots=2\n", encoding="utf-8")
    sub = cluster / "jobs"
    sub.mkdir()
    (sub / "train.py").write_text("", encoding="utf-8")
    job = load_job(write_job(sub, 'inventory = "../hostfile"\n[job]\nscript = "train.py"\n'))
    assert [h.slots for h in job.hosts] == [2, 2]
    assert job.base_dir == sub.resolve()


def test_module_and_remote_workdirs_need_no_local_script(tmp_path: Path) -> None:
    (tmp_path / "hosts.toml").write_text(
        '[defaults]\nworkdir = "/srv/ddp"\n[[hosts]]\nname = "n[1-2]"\n', encoding="utf-8"
    )
    job = load_job(write_job(tmp_path, 'inventory = "hosts.toml"\n[job]\nscript = "gone.py"\n'))
    assert job.script == "gone.py"
    job = load_job(write_job(tmp_path, '[job]\nmodule = "pkg.train"\n', name="mod.toml"))
    assert (job.script, job.module) == (None, "pkg.train")


def test_overrides_applied_after_file(cluster: Path) -> None:
    path = write_job(
        cluster,
        'inventory = "hosts.toml"\n[job]\nscript = "train.py"\nnproc_per_node = 2\n'
        '[rendezvous]\nmaster_port = 29521\n[env]\nA = "file"\nB = "file"\n',
    )
    overrides = JobOverrides(
        nproc_per_node="4",  # type: ignore[arg-type]  # CLI strings are accepted
        master_port="auto",
        env=(("B", "cli"), ("C", "x=y")),
        hosts=("node2,node[0-1]",),
    )
    job = load_job(path, overrides)
    assert job.nproc_per_node == 4
    assert job.rendezvous.master_port == "auto"
    assert dict(job.env) == {"A": "file", "B": "cli", "C": "x=y"}
    assert [h.name for h in job.hosts] == ["node2", "node0", "node1"]
    job = load_job(path, JobOverrides(nproc_per_node="gpu", master_port=29600))
    assert (job.nproc_per_node, job.rendezvous.master_port) == ("gpu", 29600)
    assert len(job.hosts) == 3


@pytest.mark.parametrize(("table", "want"), [
    ("", MetricsSpec(port=None, every=5.0, keep_ended=300.0)),
    ("[metrics]\n", MetricsSpec()),
    ("[metrics]\nport = 9400\n", MetricsSpec(port=9400)),
    ('[metrics]\nevery = "10s"\nkeep_ended = "5m"\n', MetricsSpec(every=10.0, keep_ended=300.0)),
    ("[metrics]\nevery = 0.5\nkeep_ended = 0\n", MetricsSpec(every=0.5, keep_ended=0.0)),
    ('[metrics]\nport = 65535\nevery = 3600\nkeep_ended = "7d"\n',
     MetricsSpec(port=65535, every=3600.0, keep_ended=7 * 86400.0)),
])
def test_the_metrics_table_is_read_with_its_defaults(cluster: Path, table: str, want: MetricsSpec) -> None:
    path = write_job(cluster, f'inventory = "hosts.toml"\n[job]\nscript = "train.py"\n{table}')
    assert load_job(path).metrics == want


def test_metrics_port_flag_replaces_the_files_port(cluster: Path) -> None:
    path = write_job(cluster, 'inventory = "hosts.toml"\n[job]\nscript = "train.py"\n'
                              '[metrics]\nport = 9400\nevery = "2s"\n')
    assert load_job(path, JobOverrides(metrics_port=9500)).metrics == MetricsSpec(port=9500, every=2.0)
    assert load_job(path, JobOverrides()).metrics.port == 9400
    job = apply_overrides(load_job(path), JobOverrides(metrics_port=9600))  # the Python API's way
    assert job.metrics == MetricsSpec(port=9600, every=2.0)
    assert apply_overrides(job, JobOverrides()).metrics.port == 9600


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NCCL_DEBUG=INFO", ("NCCL_DEBUG", "INFO")),
        ("A=b=c", ("A", "b=c")),
        ("EMPTY=", ("EMPTY", "")),
        ("_x1=  spaced ", ("_x1", "  spaced ")),
    ],
)
def test_parse_env_assignment(text: str, expected: tuple[str, str]) -> None:
    assert parse_env_assignment(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("NCCL_DEBUG", '"NCCL_DEBUG" is not KEY=VALUE'),
        ("1X=a", '"1X" is not a valid environment variable name'),
        ("=a", '"" is not a valid environment variable name'),
        ("A B=c", '"A B" is not a valid environment variable name'),
    ],
)
def test_parse_env_assignment_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_env_assignment(text)
    assert message in info.value.message
    assert info.value.key == "--env"
    assert str(info.value).startswith("option --env: ")


def test_rendezvous_join_timeout_is_read_and_bounded(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "j"\nscript = "train.py"\n[rendezvous]\njoin_timeout = 30\n')
    assert load_job(job).rendezvous.join_timeout == 30.0
    job.write_text('[job]\nname = "j"\nscript = "train.py"\n')
    assert load_job(job).rendezvous.join_timeout == 120.0
    job.write_text('[job]\nname = "j"\nscript = "train.py"\n[rendezvous]\njoin_timeout = -1\n')
    with pytest.raises(ConfigError) as err:
        load_job(job)
    assert (err.value.key, err.value.line) == ("rendezvous.join_timeout", 5)


def test_pick_interfaces_is_on_unless_the_job_turns_it_off_and_survives_overrides(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "j"\nscript = "train.py"\n')
    assert load_job(job).rendezvous.pick_interfaces is True
    job.write_text('[job]\nname = "j"\nscript = "train.py"\n[rendezvous]\npick_interfaces = false\n')
    off = load_job(job)
    assert off.rendezvous.pick_interfaces is False
    assert apply_overrides(off, JobOverrides(master_port=29600)).rendezvous.pick_interfaces is False
    job.write_text('[job]\nname = "j"\nscript = "train.py"\n[rendezvous]\npick_interfaces = "no"\n')
    with pytest.raises(ConfigError) as err:
        load_job(job)
    assert (err.value.key, err.value.line) == ("rendezvous.pick_interfaces", 5)
