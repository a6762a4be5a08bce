"""NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME matching follows NCCL's and torch's syntax exactly."""

from __future__ import annotations

import pytest

from node_agent.host.ifname import (
    IfSpec,
    is_suspicious,
    match_gloo,
    match_nccl,
    nccl_auto_pick,
    nccl_value_is_used,
    parse_nccl_ifname,
)

IFACES = ["lo", "eth0", "eth1", "eth10", "ib0", "docker0", "virbr0", "enp1s0f0"]


@pytest.mark.parametrize(("value", "expected"), [
    ("eth", IfSpec(["eth"], exclude=False, exact=False)),
    ("eth0,ib", IfSpec(["eth0", "ib"], exclude=False, exact=False)),
    ("^docker,lo", IfSpec(["docker", "lo"], exclude=True, exact=False)),
    ("=eth1", IfSpec(["eth1"], exclude=False, exact=True)),
    ("^=eth1,eth10", IfSpec(["eth1", "eth10"], exclude=True, exact=True)),
    ("eth0:1234,ib0", IfSpec(["eth0", "ib0"], exclude=False, exact=False)),
    ("eth0,,", IfSpec(["eth0"], exclude=False, exact=False)),
])
def test_parse_nccl_ifname(value: str, expected: IfSpec) -> None:
    assert parse_nccl_ifname(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("eth", ["eth0", "eth1", "eth10"]),  # a prefix matches every name starting with it
    ("eth1", ["eth1", "eth10"]),
    ("=eth1", ["eth1"]),  # '=' makes it exact
    ("^eth", ["lo", "ib0", "docker0", "virbr0", "enp1s0f0"]),
    ("^=eth1", ["lo", "eth0", "eth10", "ib0", "docker0", "virbr0", "enp1s0f0"]),
    ("^docker,lo", ["eth0", "eth1", "eth10", "ib0", "virbr0", "enp1s0f0"]),
    ("enp1s0", ["enp1s0f0"]),
    ("=enp1s0", []),
    ("bond", []),
    ("ib0,eth0", ["eth0", "ib0"]),  # interface order, not list order
])
def test_match_nccl(value: str, expected: list[str]) -> None:
    assert match_nccl(value, IFACES) == expected


@pytest.mark.parametrize(("ifaces", "expected"), [
    (["lo", "ib0", "eth0"], ["ib0"]),  # InfiniBand first
    (["lo", "docker0", "eth0", "virbr0"], ["eth0", "virbr0"]),  # then anything but docker/lo
    (["lo", "docker0"], ["docker0"]),  # then docker
    (["lo"], ["lo"]),  # then loopback
    ([], []),
])
def test_nccl_auto_pick(ifaces: list[str], expected: list[str]) -> None:
    assert nccl_auto_pick(ifaces) == expected


@pytest.mark.parametrize(("value", "used"), [(None, False), ("", False), ("e", False),
                                             ("^", False), ("ib", True), ("eth0", True)])
def test_nccl_ignores_values_of_one_character(value: str | None, used: bool) -> None:
    assert nccl_value_is_used(value) is used


@pytest.mark.parametrize(("value", "expected"), [
    ("eth0", ["eth0"]), ("eth", []), ("eth0,ib0", ["eth0", "ib0"]), ("eth0, missing", ["eth0"]),
])
def test_match_gloo_is_exact(value: str, expected: list[str]) -> None:
    assert match_gloo(value, IFACES) == expected


@pytest.mark.parametrize(("name", "suspicious"), [
    ("docker0", True), ("virbr0", True), ("lo", True), ("veth12ab", True), ("eth0", False),
    ("ib0", False), ("enp1s0f0", False),
])
def test_is_suspicious(name: str, suspicious: bool) -> None:
    assert is_suspicious(name) is suspicious
