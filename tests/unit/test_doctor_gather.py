"""The probe plan is pure: who dials which address and port, from the facts each host sent."""

from __future__ import annotations

from typing import Any

import pytest
from doctor_fixtures import HOSTS, clean_facts, context, host_facts

from orchestrator.doctor.gather import Opened, facts_request, plan_targets, probe_address


@pytest.mark.parametrize(("routes", "expected"), [
    ({"198.18.0.10": {"dev": "eth0", "src": "198.18.0.11", "type": None}}, "198.18.0.11"),
    ({"198.18.0.10": {"dev": "lo", "src": "198.18.0.10", "type": "local"}}, "198.18.0.11"),
    ({"198.18.0.10": {"error": "no route"}}, "198.18.0.11"),
    ({}, "198.18.0.11"),
])
def test_peers_dial_the_source_address_of_the_route_to_the_master(routes: dict[str, Any],
                                                                  expected: str) -> None:
    facts = host_facts("node1", {"resolution": {"master": [], "routes": routes}})
    assert probe_address(HOSTS[1], facts) == expected


def opened(ports: dict[int, dict[int, int | None]]) -> dict[str, Opened]:
    return {h.name: Opened(session=None, facts=host_facts(h.name, clean_facts(i)),  # type: ignore[arg-type]
                           ports=ports[i]) for i, h in enumerate(HOSTS) if i in ports}


def test_every_listener_is_a_target_and_the_master_port_only_when_bound() -> None:
    targets = plan_targets(context(), opened({0: {0: 40000, 29500: 29500}, 1: {0: 40001},
                                              2: {0: 40002}}))
    assert [(t.host, t.address, t.port, t.purpose) for t in targets] == [
        ("node0", "198.18.0.10", 40000, "ephemeral"),
        ("node0", "198.18.0.10", 29500, "master_port"),
        ("node1", "198.18.0.11", 40001, "ephemeral"),
        ("node2", "198.18.0.12", 40002, "ephemeral"),
    ]
    busy = plan_targets(context(), opened({0: {0: 40000, 29500: None}, 1: {0: 40001}}))
    assert [t.purpose for t in busy] == ["ephemeral", "ephemeral"]


def test_only_the_master_listens_on_the_master_port_and_checks_its_owner() -> None:
    ctx = context()
    master, worker = facts_request(ctx, HOSTS[0], True), facts_request(ctx, HOSTS[1], True)
    assert master["probe"]["ports"] == [0, 29500] and master["check_port"] is True
    assert worker["probe"]["ports"] == [0] and worker["check_port"] is False
    assert "probe" not in facts_request(ctx, HOSTS[0], False)
    auto = facts_request(context(master_port=None), HOSTS[0], True)
    assert auto["probe"]["ports"] == [0] and auto["check_port"] is False
