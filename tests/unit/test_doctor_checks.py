"""Each doctor check is a pure function of recorded facts: table-driven, no hosts."""

from __future__ import annotations

from typing import Any

import pytest
from doctor_fixtures import HOSTS, observe

from orchestrator.checks import agreement, clock, firewall, ifname, names, nccl, node, port, ssh
from orchestrator.checks.model import CheckStatus, Finding, Observations, ProbeOutcome, ProbeResults
from orchestrator.checks.registry import checks, run_check, run_checks
from orchestrator.errors import HostError, HostErrorKind

FAIL, WARN, INFO, OK = CheckStatus.FAIL, CheckStatus.WARN, CheckStatus.INFO, CheckStatus.OK


def worst(findings: list[Finding], host: str | None) -> CheckStatus:
    statuses = [f.status for f in findings if f.host in (host, None)]
    return max(statuses, key=lambda s: s.rank, default=CheckStatus.SKIP)


def only(findings: list[Finding], status: CheckStatus) -> list[Finding]:
    return [f for f in findings if f.status == status]


def test_a_clean_cluster_has_no_warning_or_error() -> None:
    findings = run_checks(observe())
    assert [f for f in findings if f.status.rank >= WARN.rank] == []
    assert {f.check for f in findings} == {name for name, _ in checks()}


@pytest.mark.parametrize(("kind", "message", "fix"), [
    (HostErrorKind.AUTH, "key not authorized", "ssh-copy-id 198.18.0.11"),
    (HostErrorKind.UNKNOWN_HOST_KEY, "unknown host key", "known_hosts"),
    (HostErrorKind.SSHD_DOWN, "sshd is not running", "systemctl start ssh"),
    (HostErrorKind.UNREACHABLE, "host unreachable", "port 22"),
    (HostErrorKind.CHANGED_HOST_KEY, "host key changed", "ssh-keygen -R 198.18.0.11"),
])
def test_ssh_failures_are_distinct_findings_with_their_fix(kind: HostErrorKind, message: str,
                                                           fix: str) -> None:
    obs = observe(failed={"node1": HostError("node1", kind, "paramiko said no")})
    findings = ssh.check(obs)
    bad = only(findings, FAIL)
    assert [(f.host, f.check) for f in bad] == [("node1", "ssh")]
    assert message in bad[0].message and fix in bad[0].fix
    assert "paramiko said no" in bad[0].evidence
    assert len(only(findings, OK)) == 2


@pytest.mark.parametrize(("changes", "errors", "status", "text"), [
    ({"python": {"requested": "/opt/py/bin/python", "found": None, "path_env": "/usr/bin"}},
     {}, FAIL, "not found in the non-interactive SSH session"),
    ({"torch": {"importable": False, "error": "ModuleNotFoundError: No module named 'torch'"}},
     {}, FAIL, "torch is not importable"),
    ({}, {"torch": "TimeoutExpired: 90s"}, FAIL, "import torch failed"),
    ({}, {}, OK, "torch 2.13.0"),
])
def test_python_and_torch(changes: dict[str, Any], errors: dict[str, str], status: CheckStatus,
                          text: str) -> None:
    findings = node.check_python(observe({1: changes}, {1: errors}))
    f = next(f for f in findings if f.host == "node1")
    assert f.status == status and text in f.message


def test_busy_gpus_are_a_warning_naming_the_process() -> None:
    apps = [{"gpu_uuid": "GPU-11", "pid": 4242, "name": "python", "used_memory_mib": 1200.0}]
    gpus = {"gpus": [{"index": 1, "uuid": "GPU-11", "name": "NVIDIA H100",
                      "memory_total_mib": 81559.0}], "apps": apps}
    findings = node.check_gpu(observe({2: {"gpus": gpus}}))
    warned = only(findings, WARN)
    assert [f.host for f in warned] == ["node2"]
    assert "pid 4242" in warned[0].evidence and "GPU 1" in warned[0].evidence


@pytest.mark.parametrize(("nproc", "status"), [("gpu", FAIL), (2, INFO)])
def test_no_gpu(nproc: object, status: CheckStatus) -> None:
    findings = node.check_gpu(observe({1: {"gpus": None}}, nproc_per_node=nproc))
    assert worst(findings, "node1") == status


@pytest.mark.parametrize(("key", "value", "status"), [
    ("version", "2.12.0", FAIL), ("nccl", "2.18.1", FAIL), ("cuda", "11.8", WARN),
    ("python", "3.10.12", WARN),
])
def test_the_odd_host_out_is_named(key: str, value: str, status: CheckStatus) -> None:
    torch = {"importable": True, "version": "2.13.0", "cuda": "12.4", "nccl": "2.21.5",
             "python": "3.11.7", key: value}
    findings = agreement.check_versions(observe({2: {"torch": torch}}))
    bad = [f for f in findings if f.status.rank >= WARN.rank]
    assert [(f.host, f.status) for f in bad] == [("node2", status)]
    assert value in bad[0].message


def test_unequal_gpu_counts_fail_only_with_nproc_gpu() -> None:
    one_gpu = {"gpus": [{"index": 0, "uuid": "GPU-x", "name": "H100"}], "apps": []}
    assert worst(agreement.check_versions(observe({0: {"gpus": one_gpu}})), "node0") == FAIL
    assert worst(agreement.check_versions(observe({0: {"gpus": one_gpu}}, nproc_per_node=2)),
                 "node0") == OK


@pytest.mark.parametrize(("changes", "status", "text"), [
    ({"script": {"path": "/srv/job/train.py", "exists": True, "sha256": "b" * 64}}, WARN,
     "stale code"),
    ({"script": {"path": "/srv/job/train.py", "exists": False}}, FAIL, "missing"),
    ({"workdir": {"path": "/srv/job", "exists": False}}, FAIL, "does not exist"),
    ({"workdir": {"path": "/srv/job", "exists": True, "free_bytes": 500 << 20}}, WARN,
     "GiB free"),
    ({"workdir": {"path": "/srv/job", "exists": True, "free_bytes": 10 << 20}}, FAIL, "GiB free"),
])
def test_workdir_script_and_disk(changes: dict[str, Any], status: CheckStatus, text: str) -> None:
    findings = agreement.check_workdir(observe({1: changes}))
    bad = [f for f in findings if f.status.rank >= WARN.rank]
    assert [(f.host, f.status) for f in bad] == [("node1", status)]
    assert text in bad[0].message


def outcome(source: str, target: str, port: int, purpose: str, kind: str) -> ProbeOutcome:
    return ProbeOutcome(source, target, "198.18.0.1" + target[-1], port, purpose, kind == "ok",
                        kind)


def test_blocked_master_port_names_both_hosts_and_the_port() -> None:
    probes = ProbeResults(outcomes=[outcome("node1", "node0", 29500, "master_port", "timeout"),
                                    outcome("node2", "node0", 29500, "master_port", "timeout"),
                                    outcome("node1", "node0", 41000, "ephemeral", "ok")])
    findings = firewall.check(observe(probes=probes))
    bad = only(findings, FAIL)
    assert len(bad) == 1 and bad[0].host == "node0"
    assert "29500" in bad[0].message and "node1, node2" in bad[0].message
    assert "ufw allow from 198.18.0.0/24" in bad[0].fix


def test_blocked_pair_blames_the_host_with_firewall_rules() -> None:
    rules = {"firewall": {"iptables": {"policy": "ACCEPT", "blocking": ["-A INPUT -j DROP"]}}}
    probes = ProbeResults(outcomes=[outcome("node2", "node0", 41000, "ephemeral", "timeout"),
                                    outcome("node0", "node2", 42000, "ephemeral", "timeout")])
    bad = only(firewall.check(observe({2: rules}, probes=probes)), FAIL)
    assert {f.host for f in bad} == {"node2"}
    assert "-A INPUT -j DROP" in bad[0].evidence


def test_static_rules_without_a_probe_are_a_warning() -> None:
    ufw = {"firewall": {"ufw": {"active": True, "default_incoming": "deny", "rules": []}}}
    findings = firewall.check(observe({1: ufw}))
    assert worst(findings, "node1") == WARN and worst(findings, "node0") == OK


@pytest.mark.parametrize(("master_port", "owners", "bindable", "status", "text"), [
    (29500, [], True, OK, "is free"),
    (None, [], True, OK, "auto"),
    (29500, [{"pid": 77, "user": "bob", "cmdline": ["nc", "-l", "29500"]}], False, FAIL,
     "pid 77 (user bob): nc -l 29500"),
    (29500, [{"pid": 78, "user": "root", "cmdline": ["python", "train.py"],
              "ddpctl_job_id": "toy-1"}], False, WARN, "stale ddpctl job"),
    (29500, None, False, FAIL, "cannot list port owners"),
    (29500, [], False, FAIL, "owner not visible"),
])
def test_master_port(master_port: int | None, owners: Any, bindable: bool, status: CheckStatus,
                     text: str) -> None:
    mp = {"port": 29500, "bindable": bindable, "owners": owners}
    findings = port.check(observe({0: {"master_port": mp}}, master_port=master_port))
    assert [f.host for f in findings] == ["node0"]
    f = findings[0]
    assert f.status == status and text in f.message + f.evidence
    if status == FAIL:  # kill-port where the holder is seen; where it is not, kill-port sees no more
        seen = "pid" in text
        assert ("ddpctl kill-port 29500 --host node0" in f.fix) == seen and 'master_port = "auto"' in f.fix


DUMMY_VIRBR = {"name": "virbr0", "up": True,
               "addresses": [{"family": "inet", "address": "192.168.122.1", "prefixlen": 24}]}
ETH1_DOWN = {"name": "eth1", "up": False, "addresses": []}
DOCKER0 = {"name": "docker0", "up": True,
           "addresses": [{"family": "inet", "address": "172.17.0.1", "prefixlen": 16}]}
# A second NIC on the cluster's own subnet: it reaches the master too.
ETH1_UP_ROUTED = {"name": "eth1", "up": True,
                  "addresses": [{"family": "inet", "address": "198.18.0.111", "prefixlen": 24}]}


def with_iface(extra: dict[str, Any], i: int = 1) -> dict[str, Any]:
    from doctor_fixtures import clean_facts
    return {"interfaces": [*clean_facts(i)["interfaces"], extra]}


@pytest.mark.parametrize(("env", "changes", "status", "text"), [
    ({"NCCL_SOCKET_IFNAME": "eth0"}, {}, OK, "selects eth0"),
    ({"NCCL_SOCKET_IFNAME": "ens"}, {}, FAIL, "matches no interface"),
    ({"NCCL_SOCKET_IFNAME": "=eth"}, {}, FAIL, "matches no interface"),
    ({"NCCL_SOCKET_IFNAME": "eth1"}, with_iface(ETH1_DOWN), FAIL, "none is up"),
    ({"NCCL_SOCKET_IFNAME": "^eth"}, {}, FAIL, "NCCL bootstraps over lo, which does not route"),
    ({"NCCL_SOCKET_IFNAME": "^lo"}, with_iface(DOCKER0), FAIL, "docker0 does not route to the master 198.18.0.10"),
    ({"NCCL_SOCKET_IFNAME": "^lo"}, with_iface(DOCKER0), FAIL, "replaces NCCL's default skipping"),
    ({"NCCL_SOCKET_IFNAME": "^lo"}, with_iface(ETH1_UP_ROUTED), OK, "selects eth0, eth1"),
    ({"NCCL_SOCKET_IFNAME": "docker0"}, with_iface(DOCKER0), FAIL, "bootstraps over docker0"),
    ({"NCCL_SOCKET_IFNAME": "e"}, {}, WARN, "one character"),
    ({}, {}, INFO, "NCCL_SOCKET_IFNAME is unset; the master is reached via eth0"),
    ({}, with_iface(DUMMY_VIRBR), WARN, "would also use virbr0"),
])
def test_nccl_socket_ifname(env: dict[str, str], changes: dict[str, Any], status: CheckStatus,
                            text: str) -> None:
    findings = ifname.check(observe({1: changes}, env={"GLOO_SOCKET_IFNAME": "eth0", **env},
                                    pick_interfaces=False))
    f = next(f for f in findings if f.host == "node1" and "NCCL" in f.message)
    assert (f.status, text in f.message) == (status, True), f
    if status != OK:
        assert "NCCL_SOCKET_IFNAME=eth0" in f.fix


def test_the_master_suggests_its_real_interface_not_lo() -> None:
    findings = ifname.check(observe(env={"GLOO_SOCKET_IFNAME": "eth0"}))
    f = next(f for f in findings if f.host == "node0" and "NCCL" in f.message)
    assert "via eth0" in f.message


@pytest.mark.parametrize(("env", "changes", "status", "text"), [
    ({"GLOO_SOCKET_IFNAME": "eth0"}, {}, OK, "up with an address"),
    ({"GLOO_SOCKET_IFNAME": "eth9"}, {}, FAIL, "no interface eth9"),
    ({"GLOO_SOCKET_IFNAME": "docker0"}, with_iface(DOCKER0), FAIL,
     "docker0 (172.17.0.1/16) does not route to the master 198.18.0.10"),
    ({"GLOO_SOCKET_IFNAME": "eth0,docker0"}, with_iface(DOCKER0), FAIL, "docker0 (172.17.0.1/16) does not"),
    ({"GLOO_SOCKET_IFNAME": "eth1"}, with_iface(ETH1_UP_ROUTED), OK, "up with an address"),
    ({"GLOO_SOCKET_IFNAME": "eth1"}, with_iface(ETH1_DOWN), FAIL, "down"),
    ({}, {"hostname_resolution": [{"family": "inet", "address": "127.0.1.1"}]}, FAIL,
     "resolves to 127.0.1.1"),
    ({}, {"hostname_resolution": []}, FAIL, "does not resolve"),
    ({}, {}, INFO, "Gloo uses node1 -> 198.18.0.11"),
])
def test_gloo_socket_ifname(env: dict[str, str], changes: dict[str, Any], status: CheckStatus,
                            text: str) -> None:
    """With pick_interfaces off, what Gloo would do alone: a loopback or unresolvable hostname is
    a certain failure on a multi-host job."""
    findings = ifname.check(observe({1: changes}, env={"NCCL_SOCKET_IFNAME": "eth0", **env},
                                    pick_interfaces=False))
    f = next(f for f in findings if f.host == "node1" and "GLOO" in f.message)
    assert (f.status, text in f.message) == (status, True), f


@pytest.mark.parametrize("resolution", [[{"family": "inet", "address": "127.0.1.1"}], []])
def test_a_job_on_one_remote_host_is_not_failed_for_its_hostname(resolution: list[dict[str, str]]) -> None:
    """Its ranks meet on that host, where Gloo on loopback (or its fallback to it) works."""
    one = (HOSTS[1],)
    obs = observe({1: {"hostname_resolution": resolution}}, env={"NCCL_SOCKET_IFNAME": "eth0"}, hosts=one,
                  master=HOSTS[1], workdirs={HOSTS[1].name: "/srv/job"}, pick_interfaces=False)
    f = next(f for f in ifname.check(obs) if f.host == "node1" and "GLOO" in f.message)
    assert (f.status, f.message) == (INFO, "GLOO_SOCKET_IFNAME is unset (single host)")


def test_job_env_wins_over_the_host_env() -> None:
    obs = observe({1: {"env": {"NCCL_SOCKET_IFNAME": "bogus"}}},
                  env={"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"})
    assert worst(ifname.check(obs), "node1") == OK
    obs = observe({1: {"env": {"NCCL_SOCKET_IFNAME": "bogus"}}}, env={"GLOO_SOCKET_IFNAME": "eth0"})
    assert worst(ifname.check(obs), "node1") == FAIL


@pytest.mark.parametrize(("env", "changes", "status", "text"), [
    ({"NCCL_IB_DISABLE": "1"}, {"infiniband": ["mlx5_0"], "memlock": {"soft": None}}, WARN,
     "NCCL_IB_DISABLE=1"),
    ({}, {}, INFO, "no InfiniBand"),
    ({"NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "LOUD"}, {}, WARN, "NCCL_DEBUG=LOUD"),
    ({"NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "info"}, {}, OK, "consistent"),
    ({"NCCL_IB_DISABLE": "1", "NCCL_DEBUG_SUBSYS": "INIT,NETWORK"}, {}, WARN, "NETWORK"),
    ({"NCCL_IB_DISABLE": "1", "NCCL_DEBUG_SUBSYS": "^INIT,COLL"}, {}, OK, "consistent"),
    ({}, {"infiniband": ["mlx5_0"], "memlock": {"soft": 65536}}, WARN, "ulimit -l"),
    ({}, {"infiniband": ["mlx5_0"], "memlock": {"soft": None}}, OK, "IB: mlx5_0"),
])
def test_nccl_env(env: dict[str, str], changes: dict[str, Any], status: CheckStatus,
                  text: str) -> None:
    findings = nccl.check(observe({1: changes}, env=env))
    mine = [f for f in findings if f.host == "node1"]
    assert worst(mine, "node1") == status
    assert any(text in f.message for f in mine), mine


@pytest.mark.parametrize(("changes", "errors", "status", "text"), [
    ({"resolution": {"master": [{"family": "inet", "address": "127.0.1.1"}], "routes": {}}}, {},
     FAIL, "loopback 127.0.1.1"),
    ({"resolution": {"master": [{"family": "inet", "address": "198.18.0.99"}], "routes": {}}},
     {}, FAIL, "but to 198.18.0.10 on the other hosts"),
    ({}, {"resolution": "gaierror: Name or service not known"}, FAIL, "does not resolve"),
    ({"resolution": {"master": [{"family": "inet6", "address": "fd00::10"},
                                {"family": "inet", "address": "198.18.0.10"}],
                     "routes": {"fd00::10": {"error": "Network is unreachable"}}}}, {}, WARN,
     "IPv6-first"),
    ({"hostname": "node0"}, {}, WARN, "shared by node0, node1"),
])
def test_name_resolution(changes: dict[str, Any], errors: dict[str, str], status: CheckStatus,
                         text: str) -> None:
    findings = names.check(observe({1: changes}, {1: errors}))
    mine = [f for f in findings if f.host == "node1"]
    assert worst(mine, "node1") == status
    assert any(text in f.message for f in mine), mine


def test_clock_skew_past_two_seconds_warns_on_the_odd_host() -> None:
    from doctor_fixtures import NOW
    findings = clock.check(observe({2: {"time": NOW + 5.0}}))
    assert [(f.host, f.status) for f in findings if f.status == WARN] == [("node2", WARN)]
    assert worst(clock.check(observe({2: {"time": NOW + 0.5}})), "node2") == OK


def test_a_crashing_check_becomes_a_fail_finding() -> None:
    def broken(obs: Observations) -> list[Finding]:
        raise KeyError("surprise")

    findings = run_check("broken", broken, observe())
    assert [(f.check, f.status, f.host) for f in findings] == [("broken", FAIL, None)]
    assert "KeyError" in findings[0].message


@pytest.mark.parametrize(("backend", "resolved", "status"), [
    ("c10d", [], FAIL),
    ("c10d", [{"family": "inet", "address": "198.18.0.11"}], OK),
    ("static", [], OK),  # the static rendezvous dials master_addr only
])
def test_c10d_needs_each_host_to_resolve_its_own_hostname(backend: str, resolved: list[dict[str, str]],
                                                           status: CheckStatus) -> None:
    obs = observe({1: {"hostname": "gpu-7", "hostname_resolution": resolved}},
                  {1: {"hostname_resolution": "gaierror: [Errno -3] Temporary failure"}} if not resolved else None,
                  rdzv_backend=backend)
    findings = names.check(obs)
    assert worst(findings, "node1") == status
    if status == FAIL:
        f = next(f for f in findings if f.status == FAIL)
        assert "hostname gpu-7 of node1 does not resolve" in f.message
        assert "Temporary failure" in f.evidence
        assert "add `198.18.0.11 gpu-7` to /etc/hosts" in f.fix


def test_c10d_needs_no_hostname_where_up_gives_torchrun_the_address_the_host_reported() -> None:
    """`up` passes --local-addr from the host's own routes, so its name need not resolve; a host
    that reported no route of its own still needs it, and so does a Slurm node (no --local-addr)."""
    unresolved = {1: {"hostname_resolution": "gaierror: [Errno -2] Name or service not known"}}
    obs = observe({1: {"hostname": "gpu-7", "hostname_resolution": []}}, unresolved,
                  rdzv_backend="c10d", gives_local_addr=True)
    assert worst(names.check(obs), "node1") == OK
    no_routes = observe({1: {"hostname": "gpu-7", "hostname_resolution": [], "routes": [], "interfaces": [],
                             "resolution": {"master": [{"family": "inet", "address": "198.18.0.10"}], "routes": {}}}},
                        unresolved, rdzv_backend="c10d", gives_local_addr=True)
    assert worst(names.check(no_routes), "node1") == FAIL


def test_unresolvable_master_addr_fix_names_the_address_other_hosts_found() -> None:
    obs = observe({1: {"resolution": {}}}, {1: {"resolution": "gaierror: Name or service not known"}},
                  master_addr="master.cluster")
    f = next(f for f in names.check(obs) if f.host == "node1" and f.status == FAIL)
    assert "<" not in f.fix and "198.18.0.10 master.cluster" in f.fix


@pytest.mark.parametrize(("spec", "changes", "status", "text"), [
    (2, {}, OK, "2 rank(s) on 16 CPU(s), 2 GPU(s)"),
    (4, {}, WARN, "more than the 2 GPU(s) of node1"),
    (20, {"gpus": None}, WARN, "more than the 16 CPU(s)"),
    (100_000, {"gpus": None}, FAIL, "would start 100000 ranks on node1"),
    (3, {"gpus": None, "gpu_count": 4}, OK, "3 rank(s)"),  # the launch's gpu_count wins
    ("gpu", {}, OK, "2 rank(s) (nproc_per_node = gpu)"),
    ("gpu", {"gpus": None}, None, ""),  # no GPU: the gpu check reports it
])
def test_nproc_against_the_hosts_cpus_and_gpus(spec: object, changes: dict[str, Any],
                                               status: CheckStatus | None, text: str) -> None:
    findings = [f for f in node.check_nproc(observe({1: changes}, nproc_per_node=spec)) if f.host == "node1"]
    if status is None:
        assert findings == []
        return
    assert (findings[0].status, text in findings[0].message) == (status, True), findings


def test_master_addr_that_is_not_the_master_hosts_own_address_is_named() -> None:
    routed = {"resolution": {"master": [{"family": "inet", "address": "198.18.0.10"}],
                             "routes": {"198.18.0.10": {"dev": "eth0", "src": "198.18.0.10", "type": None}}}}
    f = next(f for f in names.check(observe({0: routed})) if f.host == "node0" and f.status == WARN)
    assert "master_addr 198.18.0.10 is not an address of node0" in f.message
    assert "node0 routes 198.18.0.10 via eth0" in f.evidence
    assert all(f.status != WARN for f in names.check(observe()))
