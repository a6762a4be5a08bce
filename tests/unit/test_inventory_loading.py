"""Inventory TOML: defaults merging, ranges, and located errors for each kind of bad input."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from inventory import ConfigError, load_inventory


def write(tmp_path: Path, text: str, name: str = "hosts.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def line_of(path: Path, needle: str, occurrence: int = 1) -> int:
    """1-based number of the line holding the `occurrence`-th `needle`."""
    hits = [i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln]
    return hits[occurrence - 1]


INVENTORY = """\
    [defaults]
    user = "ddp"
    port = 22
    python = "/opt/venv/bin/python"
    workdir = "/srv/ddp"
    gpus = 2
    env = { NCCL_DEBUG = "WARN", SHARED = "yes" }

    [[hosts]]
    name = "node[0-1]"
    address = "198.18.0.[10-11]"

    [[hosts]]
    name = "gpu01"
    user = "root"
    port = 2222
    gpus = "auto"
    slots = 8
    [hosts.env]
    NCCL_DEBUG = "INFO"

    [[hosts]]
    name = "bare"
    address = "198.18.0.20"
    workdir = "~/run"
"""


def test_defaults_and_overrides_merge(tmp_path: Path) -> None:
    path = write(tmp_path, INVENTORY)
    inv = load_inventory(path)
    assert inv.source == path
    assert inv.names() == ["node0", "node1", "gpu01", "bare"]
    node0, node1, gpu01, bare = inv.hosts
    assert (node0.address, node1.address) == ("198.18.0.10", "198.18.0.11")
    assert (node0.user, node0.port, node0.python, node0.workdir, node0.gpus) == (
        "ddp",
        22,
        "/opt/venv/bin/python",
        "/srv/ddp",
        2,
    )
    assert gpu01.address == "gpu01"  # address defaults to the name
    assert (gpu01.user, gpu01.port, gpu01.gpus, gpu01.slots) == ("root", 2222, "auto", 8)
    assert dict(gpu01.env) == {"NCCL_DEBUG": "INFO", "SHARED": "yes"}
    assert dict(node0.env) == {"NCCL_DEBUG": "WARN", "SHARED": "yes"}
    assert bare.workdir == "~/run"
    assert inv.get("198.18.0.11") is node1
    with pytest.raises(TypeError):
        node0.env["X"] = "1"  # type: ignore[index]


def test_minimal_inventory_uses_model_defaults(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, '[[hosts]]\nname = "a"\n'))
    (host,) = inv.hosts
    assert (host.address, host.user, host.port, host.python, host.workdir, host.gpus) == (
        "a",
        None,
        None,
        "python3",
        None,
        "auto",
    )
    assert dict(host.env) == {}


METRICS_INVENTORY = """\
    [defaults.metrics]
    textfile_dir = "/var/lib/prometheus/node-exporter"

    [[hosts]]
    name = "node[0-1]"

    [[hosts]]
    name = "gpu[01-02]"
    metrics = { textfile_dir = "/srv/textfile" }

    [[hosts]]
    name = "bare"
    [hosts.metrics]
    textfile_dir = "~/node-exporter"

    [[hosts]]
    name = "other"
    metrics = {}
"""


def test_a_hosts_own_textfile_dir_wins_over_defaults_and_ranges_inherit_it(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, METRICS_INVENTORY))
    assert {h.name: h.metrics_dir for h in inv.hosts} == {
        "node0": "/var/lib/prometheus/node-exporter", "node1": "/var/lib/prometheus/node-exporter",
        "gpu01": "/srv/textfile", "gpu02": "/srv/textfile",
        "bare": "~/node-exporter",  # the host's home: expanded there
        "other": "/var/lib/prometheus/node-exporter"}  # an empty table sets nothing


def test_no_textfile_dir_without_a_metrics_table(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, INVENTORY))
    assert [h.metrics_dir for h in inv.hosts] == [None] * 4
    one = load_inventory(write(tmp_path, '[[hosts]]\nname = "a"\nmetrics.textfile_dir = "/prom"\n'))
    assert one.hosts[0].metrics_dir == "/prom"


def test_inline_array_of_host_tables(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, 'hosts = [{ name = "a" }, { name = "b", port = 23 }]\n'))
    assert inv.names() == ["a", "b"]
    assert inv.hosts[1].port == 23


# (case id, toml text, message part, key, line needle (None: no line), hint part)
BAD_INVENTORIES = [
    (
        "syntax",
        '[[hosts]]\nname = "a"\nport = \n',
        "invalid TOML: Invalid value",
        None,
        "port = ",
        "TOML syntax",
    ),
    (
        "unknown-host-key",
        '[[hosts]]\nname = "a"\nwrokdir = "/x"\n',
        'unknown key "wrokdir" in [hosts[0]]',
        "hosts[0].wrokdir",
        "wrokdir",
        'did you mean "workdir"?',
    ),
    (
        "unknown-top-key",
        '[default]\nuser = "x"\n[[hosts]]\nname = "a"\n',
        'unknown key "default" at the top level',
        "default",
        "[default]",
        'did you mean "defaults"?',
    ),
    (
        "port-type",
        '[[hosts]]\nname = "a"\n[[hosts]]\nname = "b"\nport = "abc"\n',
        'expected an integer, got string "abc"',
        "hosts[1].port",
        'port = "abc"',
        "whole number",
    ),
    (
        "port-quoted-number",
        '[defaults]\nport = "22"\n[[hosts]]\nname = "a"\n',
        'expected an integer, got string "22"',
        "defaults.port",
        'port = "22"',
        "without quotes",
    ),
    (
        "port-range",
        '[[hosts]]\nname = "a"\nport = 70000\n',
        "port 70000 is outside 1-65535",
        "hosts[0].port",
        "port = 70000",
        "between 1 and 65535",
    ),
    (
        "port-zero",
        '[defaults]\nport = 0\n[[hosts]]\nname = "a"\n',
        "port 0 is outside 1-65535",
        "defaults.port",
        "port = 0",
        None,
    ),
    (
        "gpus-negative",
        '[[hosts]]\nname = "a"\ngpus = -1\n',
        "-1 is out of range",
        "hosts[0].gpus",
        "gpus = -1",
        "between 0 and 1024",
    ),
    (
        "env-int",
        '[defaults]\nenv = { OMP_NUM_THREADS = 4 }\n[[hosts]]\nname = "a"\n',
        "expected a string, got integer 4",
        "defaults.env.OMP_NUM_THREADS",
        "OMP_NUM_THREADS",
        'quote it: OMP_NUM_THREADS = "4"',
    ),
    (
        "env-bool-table",
        '[[hosts]]\nname = "a"\n[hosts.env]\nX = "1"\nDEBUG = true\n',
        "expected a string, got boolean true",
        "hosts[0].env.DEBUG",
        "DEBUG = true",
        'quote it: DEBUG = "true"',
    ),
    (
        "env-bad-name",
        '[[hosts]]\nname = "a"\nenv = { "1BAD" = "x" }\n',
        '"1BAD" is not a valid environment variable name',
        "hosts[0].env.1BAD",
        "1BAD",
        None,
    ),
    (
        "empty",
        "[defaults]\nuser = 'x'\n",
        "inventory has no hosts",
        "hosts",
        None,
        "[[hosts]]",
    ),
    (
        "empty-list",
        "hosts = []\n",
        "inventory has no hosts",
        "hosts",
        "hosts = []",
        None,
    ),
    (
        "duplicate",
        '[[hosts]]\nname = "n[1-3]"\n[[hosts]]\nname = "x"\n[[hosts]]\nname = "n2"\n',
        'duplicate host "n2": defined at line 2 (hosts[0].name) and again at line 6 '
        "(hosts[2].name)",
        "hosts[2].name",
        'name = "n2"',
        "unique",
    ),
    (
        "no-name",
        '[[hosts]]\naddress = "198.18.0.1"\n',
        "host entry has no name",
        "hosts[0]",
        "[[hosts]]",
        "name =",
    ),
    (
        "bad-range",
        '[[hosts]]\nname = "n[5-1]"\n',
        "range 5-1 is reversed",
        "hosts[0].name",
        "name =",
        "ranges look like",
    ),
    (
        "range-single-address",
        '[[hosts]]\nname = "n[1-2]"\naddress = "198.18.0.1"\n',
        "name is a range of 2 hosts but address '198.18.0.1' is a single address",
        "hosts[0].address",
        "address =",
        "same length",
    ),
    (
        "range-length-mismatch",
        '[[hosts]]\nname = "n[1-2]"\naddress = "198.18.0.[1-3]"\n',
        "address range has 3 entries but the name range has 2",
        "hosts[0].address",
        "address =",
        "same length",
    ),
    (
        "option-like-address",
        '[[hosts]]\nname = "a"\naddress = "-oProxyCommand=evil"\n',
        'starts with "-"',
        "hosts[0].address",
        "address =",
        None,
    ),
    (
        "user-space",
        '[[hosts]]\nname = "a"\nuser = "a b"\n',
        "contains whitespace",
        "hosts[0].user",
        "user =",
        None,
    ),
    (
        "metrics-dir-relative",
        '[defaults.metrics]\ntextfile_dir = "prom"\n[[hosts]]\nname = "a"\n',
        'textfile_dir must be an absolute path or start with "~/", got "prom"',
        "defaults.metrics.textfile_dir",
        "textfile_dir =",
        "--collector.textfile.directory",
    ),
    (
        "metrics-dir-other-home",
        '[[hosts]]\nname = "a"\nmetrics = { textfile_dir = "~prom/textfile" }\n',
        'textfile_dir must be an absolute path or start with "~/", got "~prom/textfile"',
        "hosts[0].metrics.textfile_dir",
        "textfile_dir =",
        "/var/lib/prometheus/node-exporter",
    ),
    (
        "metrics-dir-type",
        '[[hosts]]\nname = "a"\n[[hosts]]\nname = "b"\n[hosts.metrics]\ntextfile_dir = 3\n',
        "expected a string, got integer 3",
        "hosts[1].metrics.textfile_dir",
        "textfile_dir = 3",
        'quote it: "3"',
    ),
    (
        "metrics-dir-empty",
        '[defaults]\nmetrics = { textfile_dir = "" }\n[[hosts]]\nname = "a"\n',
        "must not be empty",
        "defaults.metrics.textfile_dir",
        "textfile_dir",
        None,
    ),
    (
        "metrics-unknown-key",
        '[defaults.metrics]\ntextfile_dri = "/x"\n[[hosts]]\nname = "a"\n',
        'unknown key "textfile_dri" in [defaults.metrics]',
        "defaults.metrics.textfile_dri",
        "textfile_dri",
        'did you mean "textfile_dir"?',
    ),
    (
        "metrics-unknown-host-key",
        '[[hosts]]\nname = "a"\nmetrics = { port = 9100 }\n',
        'unknown key "port" in [hosts[0].metrics]',
        "hosts[0].metrics.port",
        "metrics = { port",
        "allowed keys: textfile_dir",
    ),
    (
        "metrics-not-table",
        '[[hosts]]\nname = "a"\nmetrics = "/var/lib/node-exporter"\n',
        'expected a table, got string "/var/lib/node-exporter"',
        "hosts[0].metrics",
        "metrics =",
        'write metrics = { textfile_dir = "/var/lib/prometheus/node-exporter" }',
    ),
    (
        "hosts-not-tables",
        'hosts = ["a", "b"]\n',
        'expected a table, got string "a"',
        "hosts[0]",
        "hosts =",
        None,
    ),
]


@pytest.mark.parametrize(
    ("text", "message", "key", "needle", "hint"),
    [case[1:] for case in BAD_INVENTORIES],
    ids=[case[0] for case in BAD_INVENTORIES],
)
def test_bad_inventory(
    tmp_path: Path, text: str, message: str, key: str | None, needle: str | None, hint: str | None
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    err = info.value
    assert message in err.message
    assert err.file == path
    assert err.key == key
    assert err.line == (line_of(path, needle) if needle else None)
    if hint is not None:
        assert err.hint is not None and hint in err.hint
    rendered = str(err)
    assert rendered.startswith(str(path))
    assert "Traceback" not in rendered


def test_syntax_error_has_column(tmp_path: Path) -> None:
    path = write(tmp_path, '[[hosts]]\nname = "a"\nport = = 3\n')
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert (info.value.line, info.value.column) == (3, 8)
    assert "(at line" not in info.value.message


def test_unclosed_array_at_end_of_document(tmp_path: Path) -> None:
    path = write(tmp_path, '[[hosts]]\nname = "a"\nenv = { A = "1"\n')
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.message.startswith("invalid TOML")
    assert info.value.line is not None


def test_missing_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="inventory file not found"):
        load_inventory(tmp_path / "absent.toml")
    bad = tmp_path / "latin.toml"
    bad.write_bytes(b'[[hosts]]\nname = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_inventory(bad)
