"""The probe plan is pure: who dials which address and port, from what each host reported when it
listened; the round goes out once every host has listened or failed."""

from __future__ import annotations

import queue
import time
from typing import Any

from doctor_fixtures import HOSTS, clean_facts, context, host_net

from orchestrator.checks.addressing import HostNet, addressing_of
from orchestrator.checks.gather import (
    Listening,
    ProbeRound,
    Session,
    Target,
    facts_request,
    plan_targets,
)
from orchestrator.remote.agent import AgentEvent


def net(i: int, source: str | None = None) -> HostNet:
    f = clean_facts(i)
    return host_net(f["interfaces"], f["routes"], source)


def test_peers_dial_the_source_address_the_host_reported_when_it_listened() -> None:
    nets = {"node0": net(0), "node1": net(1, "198.19.0.7"), "node2": net(2)}
    dial = addressing_of(context(), nets).dial
    assert dial == {"node0": "198.18.0.10", "node1": "198.19.0.7", "node2": "198.18.0.12"}


def test_without_a_reported_network_a_host_is_dialled_at_its_inventory_address() -> None:
    dial = addressing_of(context(), {"node0": net(0), "node1": HostNet()}).dial
    assert dial["node1"] == "198.18.0.11" and dial["node2"] == "198.18.0.12"


class Recorder:
    """Stands in for a session: keeps each control line it is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, command: str, payload: dict[str, Any]) -> None:
        self.sent.append((command, payload))


def listening(ports: dict[int, dict[int, int | None]]) -> dict[str, Listening]:
    return {h.name: Listening(Recorder(), ports[i], net(i))  # type: ignore[arg-type]
            for i, h in enumerate(HOSTS) if i in ports}


def plan(ports: dict[int, dict[int, int | None]], job_holds_master: bool = False) -> list[Target]:
    ln = listening(ports)
    return plan_targets(context(), ln, addressing_of(context(), {n: x.net for n, x in ln.items()}),
                        job_holds_master)


def test_every_listener_is_a_target_and_the_master_port_only_when_bound() -> None:
    targets = plan({0: {0: 40000, 29500: 29500}, 1: {0: 40001}, 2: {0: 40002}})
    assert [(t.host, t.address, t.port, t.purpose) for t in targets] == [
        ("node0", "198.18.0.10", 40000, "ephemeral"),
        ("node0", "198.18.0.10", 29500, "master_port"),
        ("node1", "198.18.0.11", 40001, "ephemeral"),
        ("node2", "198.18.0.12", 40002, "ephemeral"),
    ]
    busy = plan({0: {0: 40000, 29500: None}, 1: {0: 40001}})
    assert [t.purpose for t in busy] == ["ephemeral", "ephemeral"]
    held = plan({0: {0: 40000}, 1: {0: 40001}}, job_holds_master=True)
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
