"""Addresses and interfaces from what the hosts report (doctor/addressing.py): the master's own
address on its route to the others, every host dialled at its route's source, the GLOO/NCCL
interface set only where the library would pick wrong, and findings that never cry firewall."""

from __future__ import annotations

import copy
from typing import Any

from doctor_fixtures import HOSTS, clean_facts, context, host_facts, host_net, observe

from inventory import Host
from orchestrator.checks import firewall, ifname, names
from orchestrator.checks.addressing import HostNet, Route, pick_interfaces, pick_master_address, plan_addressing
from orchestrator.checks.gather import settle_addressing
from orchestrator.checks.model import CheckStatus, ProbeOutcome, ProbeResults


def iface(name: str, address: str, prefixlen: int = 24, up: bool = True) -> dict[str, Any]:
    return {"name": name, "up": up, "addresses": [{"family": "inet", "address": address,
                                                   "prefixlen": prefixlen, "scope": "global"}]}


LO = iface("lo", "127.0.0.1", 8)


def route(dst: str, dev: str, src: str | None = None, gateway: str | None = None) -> dict[str, Any]:
    return {"dst": dst, "dev": dev, "src": src, "gateway": gateway, "metric": 0}


def node(i: int, dev: str = "eth0", docker: bool = False) -> HostNet:
    """A host on 198.18.0.0/24 (its default route via .1), with docker0's 172.17.0.1 if asked."""
    addr = f"198.18.0.{10 + i}"
    ifaces = [LO, iface(dev, addr)] + ([iface("docker0", "172.17.0.1", 16)] if docker else [])
    routes = [route("default", dev, gateway="198.18.0.1"), route("198.18.0.0/24", dev, addr)]
    routes += [route("172.17.0.0/16", "docker0", "172.17.0.1")] if docker else []
    return host_net(ifaces, routes)


def test_a_route_is_the_longest_prefix_and_an_own_address_is_local() -> None:
    net = node(1, docker=True)
    assert net.route("198.18.0.10") == Route("eth0", "198.18.0.11")
    assert net.route("172.17.0.5") == Route("docker0", "172.17.0.1")
    assert net.route("10.9.9.9") == Route("eth0", "198.18.0.11", "198.18.0.1")  # the default, its src the dev's
    assert net.route("198.18.0.11") == Route("eth0", "198.18.0.11", None, True)
    assert net.route("node0") is None and HostNet().route("198.18.0.10") is None


def test_the_master_is_its_address_toward_the_others_never_a_decoy_every_host_holds() -> None:
    nets = {f"node{i}": node(i, docker=True) for i in range(3)}
    assert pick_master_address(nets["node0"], {k: v for k, v in nets.items() if k != "node0"}) == "198.18.0.10"


def test_this_machine_as_master_is_its_address_on_the_bridge_not_its_own_nic() -> None:
    """localhost + a server: this machine has its real NIC (eth0, the default route) and the
    bridge the server hangs off; the server reaches it on the bridge."""
    here = host_net([LO, iface("eth0", "192.0.2.2"), iface("br-x1", "198.18.0.1")],
                   [route("default", "eth0", gateway="192.0.2.1"), route("192.0.2.0/24", "eth0", "192.0.2.2"),
                    route("198.18.0.0/24", "br-x1", "198.18.0.1")])
    picked = plan_addressing(["localhost", "node1"], "localhost", "127.0.0.1", False,
                             {"localhost": here, "node1": node(1)}, {"localhost": "127.0.0.1", "node1": "node1"})
    assert picked.master_addr == "198.18.0.1" and "localhost's address" in picked.picked
    assert picked.dial == {"localhost": "198.18.0.1", "node1": "198.18.0.11"}
    assert picked.routes["node1"].dev == "eth0"
    assert picked.routes["localhost"] == Route("br-x1", "198.18.0.1", None, True)


def test_hosts_known_only_by_alias_are_dialled_at_their_addresses() -> None:
    nets = {f"node{i}": node(i, dev="ens5" if i == 1 else "eth0") for i in range(3)}
    picked = plan_addressing([f"node{i}" for i in range(3)], "node0", "node0", False, nets,
                             {f"node{i}": f"node{i}" for i in range(3)})
    assert picked.master_addr == "198.18.0.10"
    assert picked.dial == {"node0": "198.18.0.10", "node1": "198.18.0.11", "node2": "198.18.0.12"}
    assert picked.routes["node1"].dev == "ens5"


def test_a_named_master_is_dialled_where_the_hosts_resolved_it_and_nothing_is_picked() -> None:
    nets = {f"node{i}": HostNet(node(i).interfaces, node(i).routes, None if i == 0 else f"198.18.0.{10 + i}",
                                "198.18.0.10") for i in range(3)}
    named = plan_addressing([f"node{i}" for i in range(3)], "node0", "head.example", True, nets, {})
    assert named.master_addr == "head.example" and named.picked == ""
    assert named.dial["node0"] == "198.18.0.10"


def test_no_tables_no_pick_the_inventory_address_stays() -> None:
    picked = plan_addressing(["a", "b"], "a", "198.18.0.10", False, {}, {"a": "198.18.0.10", "b": "b"})
    assert picked.master_addr == "198.18.0.10" and picked.picked == "" and picked.dial["b"] == "b"


def facts_with(i: int, **over: Any) -> Any:
    f = copy.deepcopy(clean_facts(i))
    f.update(over)
    return host_facts(f"node{i}", f)


def test_gloo_and_nccl_are_pinned_only_where_the_library_would_pick_wrong() -> None:
    eth0 = Route("eth0", "198.18.0.11")
    assert pick_interfaces({}, facts_with(1), eth0) is None  # hostname resolves to eth0's address
    looped = facts_with(1, hostname_resolution=[{"family": "inet", "address": "127.0.1.1"}])
    picked = pick_interfaces({}, looped, eth0)
    assert picked is not None and dict(picked.env) == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert "resolves to 127.0.1.1" in picked.describe()
    assert pick_interfaces({"GLOO_SOCKET_IFNAME": "eth9"}, looped, eth0) is None  # the user's stays
    unresolved = host_facts("node1", {k: v for k, v in clean_facts(1).items() if k != "hostname_resolution"},
                            {"hostname_resolution": "gaierror: Name or service not known"})
    assert dict(pick_interfaces({}, unresolved, eth0).env) == {"GLOO_SOCKET_IFNAME": "eth0"}  # type: ignore[union-attr]
    first = facts_with(1, interfaces=[LO, iface("eno1", "10.0.0.5"), *clean_facts(1)["interfaces"][1:]])
    nccl = pick_interfaces({"GLOO_SOCKET_IFNAME": "eth0"}, first, eth0)
    assert nccl is not None and dict(nccl.env) == {"NCCL_SOCKET_IFNAME": "=eth0"}
    assert "NCCL would pick eno1 first" in nccl.describe()


def test_doctor_says_what_ddpctl_sets_and_with_the_switch_off_a_certain_failure_is_an_error() -> None:
    changes = {1: {"hostname_resolution": [{"family": "inet", "address": "127.0.1.1"}]}}
    on = [f for f in ifname.check(observe(changes, env={})) if f.host == "node1" and "GLOO" in f.message]
    assert on[0].status == CheckStatus.INFO and "ddpctl sets GLOO_SOCKET_IFNAME=eth0 on node1" in on[0].message
    off = [f for f in ifname.check(observe(changes, env={}, pick_interfaces=False))
           if f.host == "node1" and "GLOO" in f.message]
    assert off[0].status == CheckStatus.FAIL


def test_a_job_wide_nccl_value_that_fits_one_host_only_gets_a_fix_that_fits_every_host() -> None:
    ens5 = {"interfaces": [LO, iface("ens5", "198.18.0.11")],
            "resolution": {"master": [{"family": "inet", "address": "198.18.0.10"}],
                           "routes": {"198.18.0.10": {"dev": "ens5", "src": "198.18.0.11", "type": None}}}}
    obs = observe({1: ens5}, env={"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"})
    nccl = next(f for f in ifname.check(obs) if f.host == "node1" and "NCCL" in f.message)
    assert nccl.status == CheckStatus.FAIL
    assert "NCCL_SOCKET_IFNAME=ens5,eth0 in the job's [env]" in nccl.fix
    assert "NCCL_SOCKET_IFNAME=ens5 in" not in nccl.fix
    gloo = next(f for f in ifname.check(obs) if f.host == "node1" and "GLOO" in f.message)
    assert "remove GLOO_SOCKET_IFNAME from the job's [env]" in gloo.fix and 'for node1 in the inventory' in gloo.fix


def test_no_fix_tells_a_user_to_remap_localhost() -> None:
    loop = {"resolution": {"master": [{"family": "inet", "address": "127.0.0.1"}],
                           "routes": {"127.0.0.1": {"dev": "lo", "src": "127.0.0.1", "type": "local"}}}}
    findings = names.check(observe({1: loop}, master_addr="localhost"))
    bad = [f for f in findings if f.status == CheckStatus.FAIL and f.host == "node1"]
    assert bad and "loopback" in bad[0].message
    assert "/etc/hosts" not in bad[0].fix and 'master_addr = "198.18.0.10"' in bad[0].fix


def test_settled_addressing_names_the_picked_master_in_every_host_facts() -> None:
    aliased = tuple(Host(name=h.name, address=h.name) for h in HOSTS)
    ctx = context(hosts=aliased, master=aliased[0], master_addr="node0", master_given=False)
    facts = {f"node{i}": host_facts(f"node{i}", {k: v for k, v in clean_facts(i).items() if k != "resolution"})
             for i in range(3)}
    settled, out, addressing = settle_addressing(ctx, facts)
    assert settled.master_addr == "198.18.0.10" and settled.master_picked
    assert addressing.dial == {"node0": "198.18.0.10", "node1": "198.18.0.11", "node2": "198.18.0.12"}
    assert out["node1"].resolution.routes["198.18.0.10"].dev == "eth0"
    assert out["node0"].resolution.routes["198.18.0.10"].type == "local"
    assert all(f.status != CheckStatus.FAIL for f in names.check(observe(master_addr="198.18.0.10")))


def outcome(source: str, target: str, kind: str, attempts: int = 6) -> ProbeOutcome:
    return ProbeOutcome(source, target, "198.18.0.10" if target == "node0" else target, 40000, "ephemeral",
                        kind == "ok", kind, "" if kind == "ok" else kind, attempts,
                        (4000.0, 3500.0, 3000.0, 2500.0, 2000.0, 1000.0)[:attempts] if kind == "timeout" else ())


def test_only_a_timeout_through_every_attempt_or_a_refusal_is_a_firewall() -> None:
    probes = ProbeResults([outcome("node1", "node0", "timeout"), outcome("node2", "node0", "ok")])
    found = [f for f in firewall.probe_findings(observe(probes=probes)) if f.status == CheckStatus.FAIL]
    assert len(found) == 1 and found[0].check == "firewall" and found[0].host == "node0"
    assert "timeout (6 attempts, each waited 4.0/3.5/3.0/2.5/2.0/1.0s)" in found[0].evidence
    unresolved = ProbeResults([outcome("node1", "node0", "unresolved", 0)])
    found = firewall.probe_findings(observe(probes=unresolved))
    assert [(f.check, f.host) for f in found] == [("dns", "node1")]
    assert "ufw" not in found[0].fix and "cannot resolve" in found[0].message
    unreachable = firewall.probe_findings(observe(probes=ProbeResults([outcome("node1", "node0", "unreachable")])))
    assert [f.check for f in unreachable] == ["ifname"] and "no route" in unreachable[0].message


def test_a_master_named_localhost_is_still_probed_where_it_can_be_reached() -> None:
    """The dns check says localhost is loopback; the probe does not add a false "refused"."""
    nets = {f"node{i}": HostNet(node(i).interfaces, node(i).routes, None, "127.0.0.1") for i in range(2)}
    named = plan_addressing(["node0", "node1"], "node0", "localhost", True, nets, {})
    assert named.master_addr == "localhost" and named.dial["node0"] == "198.18.0.10"


def test_the_kernel_table_is_read_from_proc_without_starting_ip() -> None:
    from node_agent.host.factparse import parse_proc_net_route
    text = ("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
            "eth0\t00000000\t010012C6\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
            "eth0\t000012C6\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
            "eth0\t000013C6\t00000000\t0201\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")  # an unreachable route
    routes = parse_proc_net_route(text)
    assert routes == [route("default", "eth0", gateway="198.18.0.1") | {"metric": 100},
                      route("198.18.0.0/24", "eth0")]
    net = host_net([LO, iface("eth0", "198.18.0.11")], routes)
    assert net.route("198.18.0.10") == Route("eth0", "198.18.0.11")  # src: the device's address
