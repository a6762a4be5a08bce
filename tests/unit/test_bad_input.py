"""Bad input found in one pass (issue 12): absurd process counts, a byte-order mark, a directory
where a file belongs, and `down` / `logs` of a job no host has."""

from __future__ import annotations

from pathlib import Path

import pytest
from job_dir import HOSTS, write_job
from typer.testing import CliRunner

from inventory import ConfigError, JobOverrides, apply_overrides, load_inventory, load_job
from inventory.fields import MAX_NPROC_PER_NODE
from inventory.model import Host, Inventory
from orchestrator.api import load
from orchestrator.cli import app
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.hostops.jobs import down_absent, logs_absent
from orchestrator.remote.pool import FanOut
from orchestrator.remote.wire import LogsFound, StoppedJob

BOM = "\ufeff"
RUN = 'inventory = "hosts.toml"\n[job]\nscript = "train.py"\n'


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.output


# --- 1. process and GPU counts are bounded --------------------------------------------------------


def test_the_bound_is_a_named_constant() -> None:
    assert MAX_NPROC_PER_NODE == 1024


@pytest.mark.parametrize("nproc", [1, MAX_NPROC_PER_NODE])
def test_nproc_per_node_inside_the_bound_loads(cluster: Path, nproc: int) -> None:
    job = load_job(write_job(cluster, RUN + f"nproc_per_node = {nproc}\n"))
    assert job.nproc_per_node == nproc


@pytest.mark.parametrize("nproc", [MAX_NPROC_PER_NODE + 1, 100000000000])
def test_nproc_per_node_past_the_bound_is_a_located_error(cluster: Path, nproc: int) -> None:
    path = write_job(cluster, RUN + f"nproc_per_node = {nproc}\n")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    err = info.value
    assert (err.file, err.line, err.column, err.key) == (path, 4, 18, "job.nproc_per_node")
    assert err.message == f"nproc_per_node {nproc} is more than 1024 processes per host"
    assert err.hint == 'use at most 1024, or "gpu" for one process per GPU'


def test_nproc_override_past_the_bound_names_the_flag(cluster: Path) -> None:
    path = write_job(cluster, RUN)
    with pytest.raises(ConfigError) as info:
        load_job(path, JobOverrides(nproc_per_node=100000000000))
    assert str(info.value) == (
        "option --nproc-per-node: nproc_per_node 100000000000 is more than 1024 processes per host\n"
        '  fix: use at most 1024, or "gpu" for one process per GPU'
    )


def test_nproc_override_of_a_loaded_job_is_bounded_too(cluster: Path) -> None:
    job = load_job(write_job(cluster, RUN))
    with pytest.raises(ConfigError, match="more than 1024 processes per host") as info:
        apply_overrides(job, JobOverrides(nproc_per_node=MAX_NPROC_PER_NODE + 1))
    assert info.value.key == "--nproc-per-node"
    with pytest.raises(ConfigError, match="more than 1024 processes per host"):
        load(job, nproc_per_node=100000000000)


def test_python_api_nproc_string_of_non_ascii_digits_is_an_error_not_a_crash(cluster: Path) -> None:
    with pytest.raises(ConfigError, match='got string "\u00b2"'):
        load(str(write_job(cluster, RUN)), nproc_per_node="\u00b2")  # type: ignore[arg-type]


def test_cli_nproc_flag_past_the_bound_exits_2_before_any_host_is_asked(cluster: Path) -> None:
    code, output = cli("up", str(write_job(cluster, RUN)), "--dry-run", "--nproc-per-node", "100000000000")
    assert code == 2
    assert "error: option --nproc-per-node: nproc_per_node 100000000000 is more than 1024" in output
    assert "world size" not in output


@pytest.mark.parametrize(
    ("text", "key", "message", "hint"),
    [
        ("gpus = 100000000000", "hosts[0].gpus", "100000000000 GPUs is more than 1024 per host",
         'give the number of GPUs the host has, or "auto" to detect it'),
        ("gpus = 1025", "hosts[0].gpus", "1025 GPUs is more than 1024 per host", None),
        ("gpus = -1", "hosts[0].gpus", "-1 is out of range", "use a value between 0 and 1024"),
        ("slots = 1025", "hosts[0].slots", "1025 is out of range", "use a value between 1 and 1024"),
        ("port = 65536", "hosts[0].port", "port 65536 is outside 1-65535", None),
        ("port = 0", "hosts[0].port", "port 0 is outside 1-65535", None),
    ],
)
def test_inventory_counts_and_ports_are_bounded(
    tmp_path: Path, text: str, key: str, message: str, hint: str | None
) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text(f'[[hosts]]\nname = "a"\n{text}\n', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    err = info.value
    assert (err.file, err.line, err.key, err.message) == (path, 3, key, message)
    if hint is not None:
        assert err.hint == hint


def test_inventory_counts_at_the_bound_load(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text('[[hosts]]\nname = "a"\ngpus = 1024\nslots = 1024\nport = 65535\n', encoding="utf-8")
    (host,) = load_inventory(path).hosts
    assert (host.gpus, host.slots, host.port) == (1024, 1024, 65535)


@pytest.mark.parametrize("port", [0, 65536, 100000000000])
def test_master_port_is_bounded(cluster: Path, port: int) -> None:
    path = write_job(cluster, RUN + f"[rendezvous]\nmaster_port = {port}\n")
    with pytest.raises(ConfigError, match=f"port {port} is outside 1-65535") as info:
        load_job(path)
    assert (info.value.line, info.value.key) == (5, "rendezvous.master_port")


# --- 2. a UTF-8 byte-order mark is accepted ------------------------------------------------------


def test_job_and_inventory_with_a_bom_load(cluster: Path) -> None:
    (cluster / "hosts.toml").write_text(BOM + HOSTS, encoding="utf-8")
    job = load_job(write_job(cluster, BOM + RUN + "nproc_per_node = 2\n"))
    assert job.nproc_per_node == 2
    assert [h.name for h in job.hosts] == ["node0", "node1", "node2"]


def test_hostfile_with_a_bom_loads(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text(BOM + "worker-1 slots=4\n", encoding="utf-8")
    assert load_inventory(path).names() == ["worker-1"]


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        (RUN + 'nproc_per_node = "two"\n', 4, 18),  # a semantic error, located by the key index
        (RUN + "nproc_per_node = = 2\n", 4, 18),  # a syntax error, located by tomllib
        ('inventroy = "hosts.toml"\n[job]\nscript = "train.py"\n', 1, 1),  # on the BOM's own line
        ("[job\n", 1, 5),
    ],
)
def test_errors_after_a_bom_have_the_lines_and_columns_of_the_file_without_it(
    cluster: Path, text: str, line: int, column: int
) -> None:
    located = []
    for name, prefix in (("plain.toml", ""), ("bom.toml", BOM)):
        with pytest.raises(ConfigError) as info:
            load_job(write_job(cluster, prefix + text, name))
        located.append((info.value.line, info.value.column, info.value.message))
    assert located[0] == located[1]
    assert located[1][:2] == (line, column)


def test_only_one_leading_bom_is_dropped(cluster: Path) -> None:
    with pytest.raises(ConfigError, match="invalid TOML") as info:
        load_job(write_job(cluster, BOM + BOM + RUN))
    assert (info.value.line, info.value.column) == (1, 1)


def test_cli_runs_a_bom_job_file(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("", encoding="utf-8")
    job = write_job(tmp_path, BOM + '[job]\nscript = "train.py"\nnproc_per_node = 2\n')
    code, output = cli("up", str(job), "--dry-run")
    assert code == 0, output
    assert "world size 2" in output


# --- 3. a directory where a file belongs ---------------------------------------------------------


def test_inventory_directory_says_so_and_names_the_toml_inside(tmp_path: Path) -> None:
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "hosts.toml").write_text(HOSTS, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_inventory(tmp_path / "cluster")
    assert str(info.value) == (
        f"{tmp_path / 'cluster'}: inventory is a directory, not a file\n"
        f"  fix: give the path of the inventory itself, not of its directory; it holds "
        f"{tmp_path / 'cluster' / 'hosts.toml'}"
    )


@pytest.mark.parametrize("name", ["cluster", "cluster.toml"])  # hostfile and TOML paths alike
def test_empty_inventory_directory_says_so(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    with pytest.raises(ConfigError) as info:
        load_inventory(tmp_path / name)
    assert info.value.message == "inventory is a directory, not a file"
    assert info.value.hint == "give the path of the inventory itself, not of its directory"


def test_job_file_directory_says_so(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    with pytest.raises(ConfigError) as info:
        load_job(tmp_path / "job")
    assert (info.value.file, info.value.message) == (tmp_path / "job", "job file is a directory, not a file")


def test_job_files_inventory_directory_is_located_at_the_key(cluster: Path) -> None:
    (cluster / "cluster").mkdir()
    (cluster / "cluster" / "hosts.toml").write_text(HOSTS, encoding="utf-8")
    path = write_job(cluster, 'inventory = "cluster"\n[job]\nscript = "train.py"\n')
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert str(info.value) == (
        f"{path}:1:13, key inventory: inventory {cluster / 'cluster'} is a directory, not a file\n"
        "  fix: name the inventory file itself, relative to the job file's directory: "
        'inventory = "cluster/hosts.toml"'
    )


@pytest.mark.parametrize(
    "command",
    [
        ["ps"],
        ["down", "some-job"],
        ["logs", "some-job"],
        ["stacks", "some-job"],
        ["kill-port", "29500", "--all", "--yes"],
        ["doctor"],
    ],
    ids=lambda c: c[0],
)
def test_cli_inventory_flag_naming_a_directory_exits_2(tmp_path: Path, command: list[str]) -> None:
    code, output = cli(*command, "-i", str(tmp_path))
    assert code == 2
    assert f"error: {tmp_path}: inventory is a directory, not a file" in output
    assert "fix: give the path of the inventory itself" in output


def test_cli_job_file_directory_exits_2(tmp_path: Path) -> None:
    (tmp_path / "job.toml").mkdir()
    for command in (["up", str(tmp_path / "job.toml"), "--dry-run"], ["down", str(tmp_path / "job.toml")],
                    ["doctor", str(tmp_path / "job.toml")]):
        code, output = cli(*command)
        assert code == 2
        assert "job file is a directory, not a file" in output


def test_cli_job_files_inventory_directory_exits_2(cluster: Path) -> None:
    (cluster / "cluster").mkdir()
    path = write_job(cluster, 'inventory = "cluster"\n[job]\nscript = "train.py"\n')
    for command in (["up", str(path), "--dry-run"], ["doctor", str(path)], ["down", str(path)]):
        code, output = cli(*command)
        assert code == 2
        assert f"key inventory: inventory {cluster / 'cluster'} is a directory, not a file" in output


# --- 4. down / logs of a job no host has ---------------------------------------------------------

TWO = Inventory(hosts=(Host("node0", "198.18.0.10"), Host("node1", "198.18.0.11")), source=Path("hosts.toml"))
STOPPED = StoppedJob("toy-1", (11,), (), {11: "torchrun"}, ())
LOST = HostError("node1", HostErrorKind.UNREACHABLE, "no answer")


@pytest.mark.parametrize(
    ("succeeded", "failed", "message"),
    [
        ({"node0": [], "node1": []}, {}, "job toy-1: no host has it running (checked 2 hosts: node0, node1)"),
        ({"node0": []}, {"node1": LOST},
         "job toy-1: no host has it running (checked 1 of 2 hosts: node0; the others failed)"),
        ({"node0": [STOPPED], "node1": []}, {}, None),
        ({}, {"node0": LOST, "node1": LOST}, None),  # nobody answered: the host errors say why
    ],
)
def test_down_absent(
    succeeded: dict[str, list[StoppedJob]], failed: dict[str, HostError], message: str | None
) -> None:
    absent = down_absent("toy-1", TWO, FanOut(succeeded, failed))
    assert (absent.message if absent else None) == message
    if absent is not None:
        assert absent.fix == "check the job id: `ddpctl ps -i hosts.toml` lists running jobs and their ids"


def test_logs_absent_only_when_no_host_has_a_log() -> None:
    nothing = LogsFound(False, None, None, False)
    some = LogsFound(True, "toy-1", 0, False)
    absent = logs_absent("toy-1", TWO, FanOut({"node0": nothing, "node1": nothing}))
    assert absent is not None
    assert absent.message == "job toy-1: no host has a log of it (checked 2 hosts: node0, node1)"
    assert logs_absent("toy-1", TWO, FanOut({"node0": nothing, "node1": some})) is None


def test_many_hosts_are_cut_short() -> None:
    hosts = tuple(Host(f"n{i}", f"n{i}") for i in range(8))
    absent = down_absent("j", Inventory(hosts=hosts), FanOut({h.name: [] for h in hosts}))
    assert absent is not None and absent.message.endswith("(checked 8 hosts: n0, n1, n2, n3, n4, ...)")


@pytest.fixture
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "state"
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(root))  # LocalTransport passes os.environ on
    return root


@pytest.mark.parametrize(
    ("command", "has"), [("down", "it running"), ("logs", "a log of it")], ids=["down", "logs"]
)
def test_cli_down_and_logs_of_an_unknown_job_exit_1(state_root: Path, command: str, has: str) -> None:
    result = CliRunner().invoke(app, [command, "no-such-job-123"])
    assert result.exit_code == 1
    assert result.output == (
        f"error: job no-such-job-123: no host has {has} (checked 1 host: localhost)\n"
        "  fix: check the job id: `ddpctl ps` lists running jobs and their ids; for a job on other hosts "
        "add -i hosts.toml, or give its job.toml\n"
    )


def test_cli_down_json_of_an_unknown_job_exits_1(state_root: Path) -> None:
    result = CliRunner().invoke(app, ["down", "no-such-job-123", "--json"])
    assert result.exit_code == 1
    assert '"localhost": []' in result.output
    assert "no host has it running" in result.output


@pytest.mark.parametrize("command", [["down", "some-job"], ["kill-port", "29521"], ["up", "job.toml"]])
def test_a_grace_period_past_an_hour_is_refused_before_anything_runs(command: list[str]) -> None:
    code, output = cli(*command, "--grace", "1e300")
    assert code == 2
    assert "--grace" in output and "3600" in output and "Traceback" not in output
