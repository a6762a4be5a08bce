"""The probe plan is pure: who dials which address and port, from what each host reported when it
listened; the round goes out once every host has listened or failed."""

from __future__ import annotations

import queue
import time
from typing import Any

import pytest
from doctor_fixtures import HOSTS, context, host_facts

from orchestrator.doctor.gather import Listening, ProbeRound, Session, facts_request, plan_targets, probe_address
from orchestrator.remote.agent import AgentEvent


@pytest.mark.parametrize(("routes", "expected"), [
    ({"198.18.0.10": {"dev": "eth0", "src": "198.18.0.11", "type": None}}, "198.18.0.11"),
    ({"198.18.0.10": {"dev": "lo", "src": "198.18.0.10", "type": "local"}}, "198.18.0.11"),
    ({"198.18.0.10": {"error": "no route"}}, "198.18.0.11"),
    ({}, "198.18.0.11"),
])
def test_without_a_reported_source_peers_dial_the_facts_route_source(routes: dict[str, Any],
                                                                     expected: str) -> None:
    facts = host_facts("node1", {"resolution": {"master": [], "routes": routes}})
    assert probe_address(HOSTS[1], None, facts) == expected


def test_peers_dial_the_source_address_the_host_reported_when_it_listened() -> None:
    assert probe_address(HOSTS[1], Listening(None, {0: 40001}, "198.19.0.7")) == "198.19.0.7"  # type: ignore[arg-type]
    assert probe_address(HOSTS[1], Listening(None, {0: 40001}, None)) == "198.18.0.11"  # type: ignore[arg-type]


class Recorder:
    """Stands in for a session: keeps each control line it is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, command: str, payload: dict[str, Any]) -> None:
        self.sent.append((command, payload))


def listening(ports: dict[int, dict[int, int | None]]) -> dict[str, Listening]:
    return {h.name: Listening(Recorder(), ports[i], h.address)  # type: ignore[arg-type]
            for i, h in enumerate(HOSTS) if i in ports}


def test_every_listener_is_a_target_and_the_master_port_only_when_bound() -> None:
    targets = plan_targets(context(), listening({0: {0: 40000, 29500: 29500}, 1: {0: 40001},
                                                 2: {0: 40002}}))
    assert [(t.host, t.address, t.port, t.purpose) for t in targets] == [
        ("node0", "198.18.0.10", 40000, "ephemeral"),
        ("node0", "198.18.0.10", 29500, "master_port"),
        ("node1", "198.18.0.11", 40001, "ephemeral"),
        ("node2", "198.18.0.12", 40002, "ephemeral"),
    ]
    busy = plan_targets(context(), listening({0: {0: 40000, 29500: None}, 1: {0: 40001}}))
    assert [t.purpose for t in busy] == ["ephemeral", "ephemeral"]
    held = plan_targets(context(), listening({0: {0: 40000}, 1: {0: 40001}}), job_holds_master=True)
    assert [(t.host, t.port) for t in held] == [("node0", 40000), ("node0", 29500), ("node1", 40001)]


def test_the_round_goes_out_once_every_host_has_listened_or_failed_each_host_dialing_the_others() -> None:
    ln = listening({0: {0: 40000, 29500: 29500}, 1: {0: 40001}})
    rounds = ProbeRound(context(), job_holds_master=False)
    rounds.listened("node0", ln["node0"])
    rounds.listened("node1", ln["node1"])
    assert all(not x.session.sent for x in ln.values())  # type: ignore[attr-defined]
    rounds.listened("node2", None)  # node2 failed before it listened: the round goes
    rounds.listened("node2", None)  # ... once
    (cmd0, to0), = ln["node0"].session.sent  # type: ignore[attr-defined]
    (cmd1, to1), = ln["node1"].session.sent  # type: ignore[attr-defined]
    assert cmd0 == cmd1 == "CONNECT"
    assert to0["targets"] == ["198.18.0.11:40001"]
    assert to1["targets"] == ["198.18.0.10:40000", "198.18.0.10:29500"]
    assert [t.port for t in ln["node1"].targets or []] == [40000, 29500]


def test_no_round_goes_out_when_fewer_than_two_hosts_listen() -> None:
    ln = listening({0: {0: 40000}})
    rounds = ProbeRound(context(), job_holds_master=False)
    for h in HOSTS:
        rounds.listened(h.name, ln.get(h.name))
    assert ln["node0"].session.sent == [] and ln["node0"].targets is None  # type: ignore[attr-defined]


def test_an_event_that_comes_before_the_one_awaited_is_kept_for_its_own_wait() -> None:
    session = Session("node1", None)  # type: ignore[arg-type]
    connected = AgentEvent("connected", {"results": [{"ok": True}]})
    facts = AgentEvent("facts", {"facts": {}})
    session.events = queue.Queue()
    session.events.put([connected])  # the session's reader queues a batch of messages at a time
    session.events.put([facts])
    deadline = time.monotonic() + 5
    assert session.wait_for("facts", deadline) is facts
    assert session.wait_for("connected", deadline) is connected


def test_only_the_master_listens_on_the_master_port_and_checks_its_owner() -> None:
    ctx = context()
    master, worker = facts_request(ctx, HOSTS[0], True), facts_request(ctx, HOSTS[1], True)
    assert master["probe"]["ports"] == [0, 29500] and master["check_port"] is True
    assert worker["probe"]["ports"] == [0] and worker["check_port"] is False
    assert "probe" not in facts_request(ctx, HOSTS[0], False)
    auto = facts_request(context(master_port=None), HOSTS[0], True)
    assert auto["probe"]["ports"] == [0] and auto["check_port"] is False
