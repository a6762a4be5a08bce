"""Facts parsers against recorded command outputs: tables of {output, expected}."""

from __future__ import annotations

from typing import Any

import pytest

from node_agent.host import factparse

IP_ADDR_NETNS = (
    '[{"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"],"operstate":"UNKNOWN",'
    '"addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"host"},'
    '{"family":"inet6","local":"::1","prefixlen":128,"scope":"host"}]},'
    '{"ifindex":2,"link_index":562,"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP",'
    '"LOWER_UP"],"operstate":"UP","addr_info":[{"family":"inet","local":"198.18.217.10",'
    '"prefixlen":24,"scope":"global","label":"eth0"},{"family":"inet6",'
    '"local":"fe80::8496:11ff:fe5b:70bf","prefixlen":64,"scope":"link"}]},'
    '{"ifindex":3,"ifname":"ifb0","flags":["BROADCAST","NOARP"],"operstate":"DOWN",'
    '"addr_info":[]}]'
)


@pytest.mark.parametrize(("output", "expected"), [
    (IP_ADDR_NETNS, [
        {"name": "lo", "up": True, "operstate": "UNKNOWN", "loopback": True, "addresses": [
            {"family": "inet", "address": "127.0.0.1", "prefixlen": 8, "scope": "host"},
            {"family": "inet6", "address": "::1", "prefixlen": 128, "scope": "host"}]},
        {"name": "eth0", "up": True, "operstate": "UP", "loopback": False, "addresses": [
            {"family": "inet", "address": "198.18.217.10", "prefixlen": 24, "scope": "global"},
            {"family": "inet6", "address": "fe80::8496:11ff:fe5b:70bf", "prefixlen": 64,
             "scope": "link"}]},
        {"name": "ifb0", "up": False, "operstate": "DOWN", "loopback": False, "addresses": []},
    ]),
    ("[]", []),
])
def test_parse_ip_addr(output: str, expected: list[dict[str, Any]]) -> None:
    assert factparse.parse_ip_addr(output) == expected


@pytest.mark.parametrize(("output", "expected"), [
    ('[{"dst":"198.18.217.11","dev":"dd185a-br","prefsrc":"198.18.217.1","flags":[],"uid":0,'
     '"cache":[]}]', {"dev": "dd185a-br", "src": "198.18.217.1", "gateway": None, "type": None}),
    ('[{"type":"local","dst":"198.18.217.10","dev":"lo","prefsrc":"198.18.217.10","flags":[],'
     '"uid":0,"cache":["local"]}]',
     {"dev": "lo", "src": "198.18.217.10", "gateway": None, "type": "local"}),
    ('[{"dst":"8.8.8.8","gateway":"192.0.2.1","dev":"eth0","prefsrc":"192.0.2.2"}]',
     {"dev": "eth0", "src": "192.0.2.2", "gateway": "192.0.2.1", "type": None}),
])
def test_parse_route_get(output: str, expected: dict[str, Any]) -> None:
    assert factparse.parse_route_get(output) == expected


def test_parse_route_get_empty_is_an_error() -> None:
    with pytest.raises(ValueError, match="no route"):
        factparse.parse_route_get("[]")


IPTABLES_FAULTS = """\
-P INPUT ACCEPT
-A INPUT -p tcp -m tcp --dport 29500 -j DROP
-A INPUT -p tcp -m multiport --dports 22,29400:29600 -j REJECT --reject-with tcp-reset
-A INPUT -m conntrack --ctstate INVALID -j DROP
"""
IPTABLES_ALL_BUT_SSH = """\
-P INPUT ACCEPT
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A INPUT -j DROP
"""


@pytest.mark.parametrize(("output", "port", "policy", "touching", "blocking"), [
    ("-P INPUT ACCEPT\n", 29500, "ACCEPT", [], []),
    (IPTABLES_FAULTS, 29500, "ACCEPT",
     ["-A INPUT -p tcp -m tcp --dport 29500 -j DROP",
      "-A INPUT -p tcp -m multiport --dports 22,29400:29600 -j REJECT --reject-with tcp-reset"],
     ["-A INPUT -p tcp -m tcp --dport 29500 -j DROP",
      "-A INPUT -p tcp -m multiport --dports 22,29400:29600 -j REJECT --reject-with tcp-reset"]),
    (IPTABLES_FAULTS, 8080, "ACCEPT", [], []),
    (IPTABLES_ALL_BUT_SSH, 29500, "ACCEPT", [], ["-A INPUT -j DROP"]),
    ("-P INPUT DROP\n-A INPUT -p udp --dport 29500 -j DROP\n", 29500, "DROP",
     ["-A INPUT -p udp --dport 29500 -j DROP"], []),
])
def test_parse_iptables_input(output: str, port: int, policy: str, touching: list[str],
                              blocking: list[str]) -> None:
    got = factparse.parse_iptables_input(output, port)
    assert (got["policy"], got["touching_port"], got["blocking"]) == (policy, touching, blocking)


NFT_FAULTS = """\
table ip filter {
\tchain INPUT {
\t\ttype filter hook input priority filter; policy accept;
\t\ttcp dport 29500 counter packets 0 bytes 0 drop
\t\tmeta l4proto tcp tcp dport { 22, 29400-29600 } counter packets 0 bytes 0 reject with tcp reset
\t\tct state invalid counter packets 0 bytes 0 drop
\t}
}
# Warning: table ip filter is managed by iptables-nft, do not touch!
"""
NFT_POLICY_DROP = """\
table inet filter {
\tchain input {
\t\ttype filter hook input priority 0; policy drop;
\t\ttcp dport 22 accept
\t}
\tchain forward {
\t\ttype filter hook forward priority 0; policy drop;
\t}
}
"""


@pytest.mark.parametrize(("output", "port", "expected"), [
    ("", 29500, {"input_chains": [], "blocking": [], "policy_drop": False}),
    (NFT_FAULTS, 29500, {"input_chains": [{"name": "INPUT", "policy": "accept"}],
                         "blocking": ["tcp dport 29500 counter packets 0 bytes 0 drop",
                                      "meta l4proto tcp tcp dport { 22, 29400-29600 } counter "
                                      "packets 0 bytes 0 reject with tcp reset"],
                         "policy_drop": False}),
    (NFT_FAULTS, 8080, {"input_chains": [{"name": "INPUT", "policy": "accept"}], "blocking": [],
                        "policy_drop": False}),
    (NFT_POLICY_DROP, 29500, {"input_chains": [{"name": "input", "policy": "drop"}],
                              "blocking": [], "policy_drop": True}),
])
def test_parse_nft_ruleset(output: str, port: int, expected: dict[str, Any]) -> None:
    assert factparse.parse_nft_ruleset(output, port) == expected


UFW_ACTIVE = """\
Status: active
Logging: on (low)
Default: deny (incoming), allow (outgoing), disabled (routed)
New profiles: skip

To                         Action      From
--                         ------      ----
22/tcp                     ALLOW IN    Anywhere
29500/tcp                  ALLOW IN    10.0.0.0/24
22/tcp (v6)                ALLOW IN    Anywhere (v6)
"""


@pytest.mark.parametrize(("output", "expected"), [
    ("Status: inactive\n", {"active": False, "default_incoming": None, "rules": []}),
    (UFW_ACTIVE, {"active": True, "default_incoming": "deny", "rules": [
        {"to": "22/tcp", "action": "ALLOW IN", "from": "Anywhere"},
        {"to": "29500/tcp", "action": "ALLOW IN", "from": "10.0.0.0/24"},
        {"to": "22/tcp (v6)", "action": "ALLOW IN", "from": "Anywhere (v6)"}]}),
])
def test_parse_ufw_status(output: str, expected: dict[str, Any]) -> None:
    assert factparse.parse_ufw_status(output) == expected


@pytest.mark.parametrize(("output", "expected"), [
    ("", []),
    ("0, GPU-1a2b, NVIDIA H100 80GB HBM3, 81559, 0\n"
     "1, GPU-3c4d, NVIDIA H100 80GB HBM3, 81559, 1234\n",
     [{"index": 0, "uuid": "GPU-1a2b", "name": "NVIDIA H100 80GB HBM3",
       "memory_total_mib": 81559.0, "memory_used_mib": 0.0},
      {"index": 1, "uuid": "GPU-3c4d", "name": "NVIDIA H100 80GB HBM3",
       "memory_total_mib": 81559.0, "memory_used_mib": 1234.0}]),
    ("0, GPU-x, Tesla V100-SXM2-16GB, 16160, [N/A]\n",
     [{"index": 0, "uuid": "GPU-x", "name": "Tesla V100-SXM2-16GB", "memory_total_mib": 16160.0,
       "memory_used_mib": None}]),
])
def test_parse_nvidia_gpus(output: str, expected: list[dict[str, Any]]) -> None:
    assert factparse.parse_nvidia_gpus(output) == expected


@pytest.mark.parametrize(("output", "expected"), [
    ("", []),
    ("No running processes found\n", []),
    ("GPU-3c4d, 4242, /usr/bin/python3, 1200\n",
     [{"gpu_uuid": "GPU-3c4d", "pid": 4242, "name": "/usr/bin/python3", "used_memory_mib": 1200.0}]),
])
def test_parse_nvidia_apps(output: str, expected: list[dict[str, Any]]) -> None:
    assert factparse.parse_nvidia_apps(output) == expected


@pytest.mark.parametrize(("output", "expected"), [
    ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5a1c6e8f-0b2d-4c3e-9f41-2d7a8b6c9e01)\n"
     "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-7e2f4a10-3c5b-4d6e-8a92-1b3c5d7e9f02)\n", 2),
    ("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6)\n"
     "  MIG 3g.20gb     Device  0: (UUID: MIG-11111111-2222-3333-4444-555555555555)\n"
     "  MIG 3g.20gb     Device  1: (UUID: MIG-66666666-7777-8888-9999-000000000000)\n", 1),
    ("No devices were found\n", 0),
    ("", 0),
], ids=["two-gpus", "mig-instances-are-not-gpus", "no-devices", "empty"])
def test_count_nvidia_list(output: str, expected: int) -> None:
    assert factparse.count_nvidia_list(output) == expected


@pytest.mark.parametrize(("code", "stdout", "stderr", "expected"), [
    (0, 'warning: x\n@@TORCH@@{"importable": true, "version": "2.13.0+cpu", "cuda": null}\n', "",
     {"importable": True, "version": "2.13.0+cpu", "cuda": None}),
    (0, '@@TORCH@@{"importable": false, "error": "ModuleNotFoundError: No module named '
        "'torch'\"}\n", "", {"importable": False,
                             "error": "ModuleNotFoundError: No module named 'torch'"}),
    (1, "", "Traceback...\nModuleNotFoundError: No module named 'torch'\n",
     {"importable": False, "error": "ModuleNotFoundError: No module named 'torch'"}),
])
def test_parse_torch_output(code: int, stdout: str, stderr: str, expected: dict[str, Any]) -> None:
    assert factparse.parse_torch_output(code, stdout, stderr) == expected


def test_parse_torch_output_crash_is_an_error() -> None:
    with pytest.raises(ValueError, match="exited -11"):
        factparse.parse_torch_output(-11, "", "Segmentation fault\n")


@pytest.mark.parametrize(("spec", "expected"), [
    ("22", [(22, 22)]), ("22,80:90", [(22, 22), (80, 90)]), ("{ 22, 29400-29600 }",
                                                              [(22, 22), (29400, 29600)]),
    ("ssh", []),
])
def test_port_ranges(spec: str, expected: list[tuple[int, int]]) -> None:
    assert factparse.port_ranges(spec) == expected
