"""Bad job files and bad overrides: each error names file, line and key (or the flag) + a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from inventory import ConfigError, JobOverrides, load_job

HOSTS = '[[hosts]]\nname = "node[0-2]"\naddress = "198.18.0.[10-12]"\n'
HEAD = 'inventory = "hosts.toml"\n[job]\n'
RUN = HEAD + 'script = "train.py"\n'


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    (tmp_path / "hosts.toml").write_text(HOSTS, encoding="utf-8")
    (tmp_path / "train.py").write_text("", encoding="utf-8")
    return tmp_path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


# (case id, job text, message part, key, line needle (None: no line), hint part)
BAD_JOBS = [
    ("malformed", RUN + "nproc_per_node = [1,\n", "invalid TOML", None, "nproc_per_node", None),
    (
        "unknown-job-key",
        RUN + "nproc_per_nodes = 2\n",
        'unknown key "nproc_per_nodes" in [job]',
        "job.nproc_per_nodes",
        "nproc_per_nodes",
        'did you mean "nproc_per_node"?',
    ),
    (
        "unknown-rdzv-key",
        RUN + '[rendezvous]\nmaster_adr = "node0"\n',
        'unknown key "master_adr" in [rendezvous]',
        "rendezvous.master_adr",
        "master_adr",
        'did you mean "master_addr"',
    ),
    (
        "unknown-top-key",
        'inventroy = "hosts.toml"\n[job]\nscript = "train.py"\n',
        'unknown key "inventroy" at the top level',
        "inventroy",
        "inventroy",
        'did you mean "inventory"?',
    ),
    (
        "port-type",
        RUN + '[rendezvous]\nmaster_port = "abc"\n',
        'expected a port number or "auto", got string "abc"',
        "rendezvous.master_port",
        "master_port",
        None,
    ),
    (
        "port-range",
        RUN + "[rendezvous]\nmaster_port = 65536\n",
        "port 65536 is outside 1-65535",
        "rendezvous.master_port",
        "master_port",
        'or "auto"',
    ),
    (
        "nproc-zero",
        RUN + "nproc_per_node = 0\n",
        "nproc_per_node must be at least 1, got 0",
        "job.nproc_per_node",
        "nproc_per_node",
        '"gpu"',
    ),
    (
        "nproc-word",
        RUN + 'nproc_per_node = "gpus"\n',
        'expected an integer >= 1 or one of "gpu", "cpu", "auto", got string "gpus"',
        "job.nproc_per_node",
        "nproc_per_node",
        'did you mean "gpu"',
    ),
    (
        "nproc-bool",
        RUN + "nproc_per_node = true\n",
        "expected an integer, got boolean true",
        "job.nproc_per_node",
        "nproc_per_node",
        None,
    ),
    (
        "host-not-in-inventory",
        RUN + 'hosts = ["node0",\n  "nod1"]\n',
        'host "nod1" is not in the inventory (',
        "job.hosts[1]",
        '"nod1"',
        'did you mean "node1"',
    ),
    (
        "host-no-close-name",
        RUN + 'hosts = ["zebra"]\n',
        'host "zebra" is not in the inventory',
        "job.hosts[0]",
        "hosts =",
        "known hosts: node0, node1, node2",
    ),
    (
        "host-twice",
        RUN + 'hosts = ["node0", "198.18.0.10"]\n',
        'host "node0" is selected twice',
        "job.hosts[1]",
        "hosts =",
        None,
    ),
    ("hosts-empty", RUN + "hosts = []\n", "host list is empty", "job.hosts", "hosts =", None),
    (
        "missing-script",
        HEAD + 'script = "nope.py"\n',
        "script not found: ",
        "job.script",
        "script =",
        "relative to the job file's directory",
    ),
    (
        "env-int",
        RUN + "[env]\nNCCL_P2P_DISABLE = 1\n",
        "expected a string, got integer 1",
        "env.NCCL_P2P_DISABLE",
        "NCCL_P2P_DISABLE",
        'quote it: NCCL_P2P_DISABLE = "1"',
    ),
    (
        "env-bool",
        RUN + "[env]\nTORCH_SHOW_CPP_STACKTRACES = true\n",
        "expected a string, got boolean true",
        "env.TORCH_SHOW_CPP_STACKTRACES",
        "TORCH_SHOW",
        '= "true"',
    ),
    (
        "args-int",
        RUN + 'args = ["--epochs", 3]\n',
        "expected a string, got integer 3",
        "job.args[1]",
        "args =",
        'quote it: "3"',
    ),
    (
        "script-and-module",
        RUN + 'module = "pkg.train"\n',
        "job sets both script and module",
        "job.module",
        "module =",
        "exactly one",
    ),
    (
        "no-entrypoint",
        HEAD + "nproc_per_node = 1\n",
        "neither script nor module",
        "job",
        "[job]",
        None,
    ),
    (
        "no-job-table",
        'inventory = "hosts.toml"\n',
        "job file has no [job] table",
        "job",
        None,
        None,
    ),
    (
        "bad-module",
        HEAD + 'module = "pkg/train.py"\n',
        "is not a Python module path",
        "job.module",
        "module =",
        None,
    ),
    (
        "bad-name",
        RUN + 'name = "my job"\n',
        "has characters other than",
        "job.name",
        "name =",
        None,
    ),
    (
        "backend",
        RUN + '[rendezvous]\nbackend = "c10"\n',
        'backend must be "static" or "c10d", got string "c10"',
        "rendezvous.backend",
        "backend",
        'did you mean "c10d"?',
    ),
    (
        "master-unknown",
        RUN + '[rendezvous]\nmaster_addr = "nod0"\n',
        'master_addr: host "nod0" is not in the inventory',
        "rendezvous.master_addr",
        "master_addr",
        'did you mean "node0"',
    ),
    (
        "master-not-selected",
        RUN + 'hosts = ["node0"]\n[rendezvous]\nmaster_addr = "node2"\n',
        'master_addr "node2" is not one of the selected hosts',
        "rendezvous.master_addr",
        "master_addr",
        None,
    ),
    (
        "master-static-not-rank0",
        RUN + 'hosts = ["node0", "node1"]\n[rendezvous]\nmaster_addr = "node1"\n',
        'master_addr "node1" is node_rank 1',
        "rendezvous.master_addr",
        "master_addr",
        'list "node1" first',
    ),
    (
        "inventory-missing",
        'inventory = "other.toml"\n[job]\nscript = "train.py"\n',
        "inventory file not found: ",
        "inventory",
        "inventory =",
        "relative to the job file's directory",
    ),
    (
        "metrics-unknown-key",
        RUN + "[metrics]\nport = 9400\nkeep_end = 60\n",
        'unknown key "keep_end" in [metrics]',
        "metrics.keep_end",
        "keep_end = 60",
        'did you mean "keep_ended"?',
    ),
    ("metrics-not-table", 'inventory = "hosts.toml"\nmetrics = 9400\n[job]\nscript = "train.py"\n',
     "expected a table, got integer 9400", "metrics", "metrics = 9400", "write it as [metrics]"),
    ("metrics-port-range", RUN + "[metrics]\nport = 70000\n", "port 70000 is outside 1-65535", "metrics.port",
     "port = 70000", "between 1 and 65535"),
    ("metrics-port-zero", RUN + "[metrics]\nport = 0\n", "port 0 is outside 1-65535", "metrics.port", "port = 0",
     None),
    ("metrics-port-quoted", RUN + '[metrics]\nport = "9400"\n', 'expected an integer, got string "9400"',
     "metrics.port", "port =", "without quotes: port = 9400"),
    ("metrics-every-short", RUN + "[metrics]\nevery = 0.1\n", "0.1 s is out of range", "metrics.every",
     "every = 0.1", "use 0.5 to 3600 seconds"),
    ("metrics-every-long", RUN + '[metrics]\nevery = "2h"\n', "7200 s is out of range", "metrics.every",
     "every =", "use 0.5 to 3600 seconds"),
    ("metrics-every-words", RUN + '[metrics]\nevery = "5 seconds"\n',
     'expected seconds or a duration, got string "5 seconds"', "metrics.every", "every =",
     'write seconds (every = 3600) or a duration with its unit: "90s"'),
    ("metrics-every-bool", RUN + "[metrics]\nevery = true\n", "expected seconds or a duration, got boolean true",
     "metrics.every", "every = true", None),
    ("metrics-keep-negative", RUN + "[metrics]\nkeep_ended = -1\n", "-1 s is out of range", "metrics.keep_ended",
     "keep_ended = -1", "use 0 to 604800 seconds"),
    ("metrics-keep-long", RUN + '[metrics]\nkeep_ended = "8d"\n', "691200 s is out of range",
     "metrics.keep_ended", "keep_ended =", "use 0 to 604800 seconds"),
    (
        "inventory-type",
        'inventory = 3\n[job]\nscript = "train.py"\n',
        "expected a string, got integer 3",
        "inventory",
        "inventory =",
        None,
    ),
]


@pytest.mark.parametrize(
    ("text", "message", "key", "needle", "hint"),
    [case[1:] for case in BAD_JOBS],
    ids=[case[0] for case in BAD_JOBS],
)
def test_bad_job(
    cluster: Path, text: str, message: str, key: str | None, needle: str | None, hint: str | None
) -> None:
    path = cluster / "job.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    err = info.value
    assert message in err.message
    assert err.file == path
    assert err.key == key
    assert err.line == (line_of(path, needle) if needle else None)
    if hint is not None:
        assert err.hint is not None and hint in err.hint
    assert str(err).startswith(str(path))


def test_missing_script_names_the_path_looked_at(cluster: Path) -> None:
    path = cluster / "job.toml"
    path.write_text(HEAD + 'script = "sub/nope.py"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert str(cluster.resolve() / "sub" / "nope.py") in info.value.message


def test_error_inside_inventory_names_the_inventory_file(cluster: Path) -> None:
    (cluster / "hosts.toml").write_text('[[hosts]]\nname = "a"\nport = 0\n', encoding="utf-8")
    path = cluster / "job.toml"
    path.write_text(RUN, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert (info.value.file, info.value.line, info.value.key) == (
        cluster / "hosts.toml",
        3,
        "hosts[0].port",
    )


# (case id, overrides, flag, message part, hint part)
BAD_OVERRIDES = [
    ("nproc-zero", JobOverrides(nproc_per_node=0), "--nproc-per-node", "at least 1, got 0", None),
    (
        "nproc-word",
        JobOverrides(nproc_per_node="cpus"),  # type: ignore[arg-type]
        "--nproc-per-node",
        'got string "cpus"',
        'did you mean "cpu"',
    ),
    ("port-range", JobOverrides(master_port=0), "--master-port", "port 0 is outside 1-65535", None),
    (
        "port-text",
        JobOverrides(master_port="high"),  # type: ignore[arg-type]
        "--master-port",
        'expected a port number or "auto", got string "high"',
        None,
    ),
    ("metrics-port-zero", JobOverrides(metrics_port=0), "--metrics-port", "port 0 is outside 1-65535",
     "use a port between 1 and 65535"),
    ("metrics-port-high", JobOverrides(metrics_port=65536), "--metrics-port", "port 65536 is outside 1-65535",
     None),
    ("env-key", JobOverrides(env=(("9LIVES", "x"),)), "--env", "not a valid environment", None),
    (
        "hosts-unknown",
        JobOverrides(hosts=("node0,nodee2",)),
        "--hosts",
        'host "nodee2" is not in the inventory',
        'did you mean "node2"',
    ),
    ("hosts-range", JobOverrides(hosts=("node[2-0]",)), "--hosts", "range 2-0 is reversed", None),
    ("hosts-empty", JobOverrides(hosts=()), "--hosts", "host list is empty", None),
]


@pytest.mark.parametrize(
    ("overrides", "flag", "message", "hint"),
    [case[1:] for case in BAD_OVERRIDES],
    ids=[case[0] for case in BAD_OVERRIDES],
)
def test_bad_override_names_the_flag(
    cluster: Path, overrides: JobOverrides, flag: str, message: str, hint: str | None
) -> None:
    path = cluster / "job.toml"
    path.write_text(RUN + "[rendezvous]\nmaster_port = 29521\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_job(path, overrides)
    err = info.value
    assert message in err.message
    assert (err.key, err.file, err.line) == (flag, None, None)
    assert str(err).startswith(f"option {flag}: ")
    if hint is not None:
        assert err.hint is not None and hint in err.hint


def test_hosts_override_that_drops_the_master(cluster: Path) -> None:
    path = cluster / "job.toml"
    path.write_text(RUN + '[rendezvous]\nmaster_addr = "node0"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_job(path, JobOverrides(hosts=("node1",)))
    assert info.value.key == "rendezvous.master_addr"
    assert info.value.line == 5
    assert "(the hosts chosen with --hosts)" in info.value.message
