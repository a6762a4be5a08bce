"""Parsing NCCL_DEBUG=INFO output: the network, interfaces and transports NCCL chose."""

from __future__ import annotations

from pathlib import Path

from node_agent.runtime.nccl_log import parse_files, parse_lines

SOCKET_RUN = """\
node0:2201:2201 [0] NCCL INFO Bootstrap : Using eth0:198.18.0.10<0>
node0:2201:2201 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)
node0:2201:2201 [0] NCCL INFO NET/IB : No device found.
node0:2201:2201 [0] NCCL INFO NET/Socket : Using [0]eth0:198.18.0.10<0> [1]docker0:172.17.0.1<0>
node0:2201:2201 [0] NCCL INFO Using network Socket
node0:2201:2290 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC
node0:2201:2290 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0
node0:2201:2290 [0] NCCL INFO Channel 01/0 : 1[1] -> 2[0] [send] via NET/Socket/1
"""

IB_RUN = """\
gpu01:77:77 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.0.1<0>
gpu01:77:77 [0] NCCL INFO Using network IB
gpu01:77:91 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA
gpu01:77:91 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct
"""


def test_socket_run_names_interfaces_and_transports() -> None:
    got = parse_lines(SOCKET_RUN.splitlines())
    assert got["networks"] == ["Socket"]
    assert got["bootstrap"] == ["eth0 (198.18.0.10)"]
    assert got["interfaces"] == ["eth0 (198.18.0.10)", "docker0 (172.17.0.1)"]
    assert got["transports"] == ["P2P/IPC", "NET/Socket"]


def test_ib_run_names_the_oob_interface_and_ib_transport() -> None:
    got = parse_lines(IB_RUN.splitlines())
    assert got["networks"] == ["IB"]
    assert "ib0 (10.1.0.1)" in got["interfaces"]
    assert got["transports"] == ["NET/IB", "SHM/direct"]


def test_parse_files_reads_every_host_file(tmp_path: Path) -> None:
    (tmp_path / "nccl.node0.1.log").write_text(SOCKET_RUN)
    (tmp_path / "nccl.node0.2.log").write_text(IB_RUN)
    got = parse_files([*sorted(tmp_path.glob("nccl.*.log")), tmp_path / "missing.log"])
    assert len(got["files"]) == 2
    assert got["networks"] == ["Socket", "IB"]


def test_no_nccl_lines_gives_empty_lists() -> None:
    assert parse_lines(["[default0]:epoch=1 loss=0.5"]) == {
        "networks": [], "interfaces": [], "bootstrap": [], "transports": []}
