"""The probe's dial plan: all pairs up to its bound; above it a sample that still dials the master
from every host, dials every host, and joins every pair of subnets."""

from __future__ import annotations

import itertools

from orchestrator.checks.probeplan import dial_plan


def names(n: int) -> list[str]:
    return [f"n{i}" for i in range(n)]


def test_up_to_the_bound_every_pair_is_dialled_and_nothing_is_said() -> None:
    hosts = names(5)
    plan = dial_plan(hosts, "n0", {}, exact_up_to=5)
    assert plan.sampled == ""
    assert {(a, b) for a, ps in plan.peers.items() for b in ps} == set(itertools.permutations(hosts, 2))


def test_above_it_every_host_dials_the_master_and_is_dialled_and_every_subnet_pair_is_joined() -> None:
    hosts = names(300)
    subnet = {h: f"rack{i % 7}" for i, h in enumerate(hosts)}
    plan = dial_plan(hosts, "n3", subnet, exact_up_to=256, peers=8)
    assert plan.sampled and "300 hosts" in plan.sampled and "7 subnet(s)" in plan.sampled
    assert all("n3" in plan.peers[h] for h in hosts if h != "n3")
    assert all(h not in plan.peers[h] for h in hosts)
    dialled = {b for ps in plan.peers.values() for b in ps}
    assert dialled == set(hosts)
    joined = {(subnet[a], subnet[b]) for a, ps in plan.peers.items() for b in ps}
    assert joined == set(itertools.product(set(subnet.values()), repeat=2))
    assert max(len(ps) for ps in plan.peers.values()) <= 8 + 1 + 7 * 7  # far below 299
    assert sum(len(ps) for ps in plan.peers.values()) < 300 * 12


def test_a_lone_host_in_its_subnet_is_still_joined_to_every_other_subnet() -> None:
    hosts = names(20)
    subnet = {h: "a" for h in hosts} | {"n19": "b"}
    plan = dial_plan(hosts, "n0", subnet, exact_up_to=4, peers=2)
    joined = {(subnet[a], subnet[b]) for a, ps in plan.peers.items() for b in ps}
    assert {("a", "b"), ("b", "a"), ("a", "a")} <= joined
