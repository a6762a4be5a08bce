"""Pure parts of node_agent.ops.ports: /proc/net tables, addresses, torchrun detection, refusal rules."""

from __future__ import annotations

import json
from typing import Any

import pytest

from node_agent.ops.ports import CLK_TCK, _addr, is_torchrun, parse_proc_net, refusal, unseen_sockets
from orchestrator.remote.wire import parse_report

HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n")
TCP = HEADER + (
    '   0: 00000000:7331 00000000:0000 0A '
    '00000000:00000000 00:00000000 00000000  1000        0 41001 1 0000000000000000 100 0 0 10 0\n'
    '   1: 0100007F:7331 0100007F:D431 01 '
    '00000000:00000000 00:00000000 00000000  1000        0 41002 1 0000000000000000 20 4 30 10 -1\n'
    '   2: 0100007F:7331 0100007F:D432 06 '
    '00000000:00000000 03:00000BB8 00000000     0        0 0 3 0000000000000000\n'
    '   3: 0100007F:D431 0100007F:7331 01 '
    '00000000:00000000 00:00000000 00000000  1000        0 41003 1 0000000000000000 20 4 30 10 -1\n'
    '   4: 0100007F:0016 00000000:0000 0A '
    '00000000:00000000 00:00000000 00000000     0        0 999 1 0000000000000000 100 0 0 10 0\n'
)
TCP6 = HEADER + (
    '   0: 00000000000000000000000001000000:7331 00000000000000000000000000000000:0000 0A '
    '00000000:00000000 00:00000000 00000000  1000        0 52001 1 0000000000000000 100 0 0 10 0\n'
    '   1: 000080FE0000000000FEFF0203000000:7331 000080FE0000000000FEFF0204000000:C000 08 '
    '00000000:00000000 00:00000000 00000000  1000        0 52002 1 0000000000000000 20 4 30 10 -1\n'
)
UDP = (
    '   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode '
    'ref pointer drops\n'
    '  123: 00000000:7331 00000000:0000 07 '
    '00000000:00000000 00:00000000 00000000   101        0 61001 2 0000000000000000 0\n'
    '  124: 0100007F:0035 00000000:0000 07 '
    '00000000:00000000 00:00000000 00000000   101        0 61002 2 0000000000000000 0\n'
)


@pytest.mark.parametrize(("text", "port", "expected"), [
    (TCP, 0x7331, [("0.0.0.0:29489", "0.0.0.0:0", "LISTEN", 41001, 1000),
                   ("127.0.0.1:29489", "127.0.0.1:54321", "ESTABLISHED", 41002, 1000),
                   ("127.0.0.1:29489", "127.0.0.1:54322", "TIME_WAIT", 0, 0)]),
    (TCP, 22, [("127.0.0.1:22", "0.0.0.0:0", "LISTEN", 999, 0)]),
    (TCP, 54321, [("127.0.0.1:54321", "127.0.0.1:29489", "ESTABLISHED", 41003, 1000)]),
    (TCP, 80, []),
    (TCP6, 0x7331, [("[::1]:29489", "[::]:0", "LISTEN", 52001, 1000),
                    ("[fe80::2ff:fe00:0:3]:29489", "[fe80::2ff:fe00:0:4]:49152", "CLOSE_WAIT", 52002, 1000)]),
    (UDP, 0x7331, [("0.0.0.0:29489", "0.0.0.0:0", "CLOSE", 61001, 101)]),
    (HEADER, 0x7331, []),
    (HEADER + "   0: garbage\n", 0x7331, []),
], ids=["tcp-port", "tcp-22", "tcp-client-side", "tcp-none", "tcp6", "udp", "empty", "garbage"])
def test_parse_proc_net(text: str, port: int, expected: list[tuple[str, str, str, int, int]]) -> None:
    got = [(s["laddr"], s["raddr"], s["status"], s["inode"], s["uid"]) for s in parse_proc_net(text, port)]
    assert got == expected


def test_time_wait_timer_is_read_in_seconds() -> None:
    tw = [s for s in parse_proc_net(TCP, 0x7331) if s["status"] == "TIME_WAIT"]
    assert tw[0]["timer_s"] == pytest.approx(0xBB8 / CLK_TCK)
    assert all(s["timer_s"] == 0.0 for s in parse_proc_net(TCP, 0x7331) if s["status"] != "TIME_WAIT")


@pytest.mark.parametrize(("hexaddr", "expected"), [
    ("0100007F:1F90", "127.0.0.1:8080"),
    ("00000000:0000", "0.0.0.0:0"),
    ("0A00A8C0:FFFF", "192.168.0.10:65535"),
    ("00000000000000000000000001000000:0016", "[::1]:22"),
    ("00000000000000000000000000000000:0050", "[::]:80"),
])
def test_addr(hexaddr: str, expected: str) -> None:
    assert _addr(hexaddr) == expected


@pytest.mark.parametrize(("cmdline", "expected"), [
    (["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node=2", "train.py"], True),
    (["torchrun", "train.py"], True),
    (["python", "-m", "torch.distributed.run", "train.py"], True),
    (["python", "train.py", "--note", "torchrun"], False),
    (["python", "-c", "import torch.distributed.run"], False),
    ([], False),
])
def test_is_torchrun(cmdline: list[str], expected: bool) -> None:
    assert is_torchrun(cmdline) is expected


ME = 1000


def owner(pid: int = 4242, uid: int = ME, name: str = "python3", job: str | None = None) -> dict[str, Any]:
    return {"pid": pid, "uid": uid, "user": "alice" if uid == ME else "bob", "name": name, "ddpctl_job_id": job}


@pytest.mark.parametrize(("o", "force", "only_ddpctl", "expect", "reason"), [
    (owner(), False, False, None, None),
    (owner(uid=1001), False, False, None, "belongs to user bob"),
    (owner(uid=1001), True, False, None, None),
    (owner(pid=1, uid=ME), True, False, None, "pid 1"),
    (owner(name="sshd"), False, False, None, "system service"),
    (owner(name="systemd"), False, False, None, "system service"),
    (owner(name="sshd"), True, False, None, None),
    (owner(pid=77), True, False, None, "ddpctl's own session"),
    (owner(), False, False, [1, 2], "not in the list you confirmed"),
    (owner(), False, False, [4242], None),
    (owner(), False, False, [], "not in the list you confirmed"),
    (owner(), False, True, None, "not a process of a ddpctl job"),
    (owner(job="j-1"), False, True, None, None),
    (owner(uid=1001, job="j-1"), False, True, None, "belongs to user bob"),
])
def test_refusal_rules(o: dict[str, Any], force: bool, only_ddpctl: bool, expect: list[int] | None,
                       reason: str | None) -> None:
    got = refusal(o, ME, {77, 78}, force, only_ddpctl, expect)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


def test_refusal_of_another_user_says_how_to_override() -> None:
    got = refusal(owner(uid=1001), ME, set(), False, False, None)
    assert got is not None and "--force" in got


def holder(laddr: str, raddr: str = "", inode: int | None = None) -> dict[str, Any]:
    return {"pid": 10, "status": "LISTEN", "laddr": laddr, "raddr": raddr, **({"inode": inode} if inode else {})}


@pytest.mark.parametrize(("holders", "unseen"), [
    ([], ["0.0.0.0:29489", "127.0.0.1:29489"]),  # nobody visible: the LISTEN and ESTABLISHED rows
    ([holder("0.0.0.0:29489", inode=41001), holder("127.0.0.1:29489", "127.0.0.1:54321", inode=41002)], []),
    ([holder("0.0.0.0:29489"), holder("127.0.0.1:29489", "127.0.0.1:54321")], []),  # psutil: by address
    ([holder("0.0.0.0:29489")], ["127.0.0.1:29489"]),
], ids=["none-visible", "by-inode", "by-address", "one-hidden"])
def test_unseen_sockets(holders: list[dict[str, Any]], unseen: list[str]) -> None:
    """Sockets with an inode (a process holds them) that no visible holder explains; TIME_WAIT never."""
    got = unseen_sockets(parse_proc_net(TCP, 0x7331), holders)
    assert [u["laddr"] for u in got] == unseen and all(u["status"] != "TIME_WAIT" for u in got)


def test_parse_report_of_a_kill() -> None:
    from node_agent.ops.ports import report
    from node_agent.wire.replies_ports import KilledProcess, RefusedProcess

    info = {"port": 29489, "proto": "tcp", "owners": [
        {"pid": 5, "user": "alice", "cmdline": ["python", "-c", "a\n  b"], "name": "python", "age_s": 3.0,
         "status": "LISTEN", "ddpctl_job_id": "j1", "is_torchrun": False, "refusal": None, "ppid": 1}],
        "unseen": [{"status": "LISTEN", "laddr": "[::]:29489", "user": "bob", "uid": 7}], "time_wait": 2,
        "time_wait_max_s": 40.5, "free": False, "bind_error": None}
    killed = (KilledProcess(5, "python -c a", "SIGKILL", True),)
    raw = json.loads(json.dumps(report(info, killed=killed, refused=(RefusedProcess(None, "unseen"),),
                                       errors=("pid 6: EPERM",), free_after=False)))
    r = parse_report("node1", raw)
    assert r.owners[0].command == "python -c a b" and r.owners[0].ddpctl_job_id == "j1"
    assert r.killed[0].signal == "SIGKILL" and r.refused[0].pid is None and r.errors == ("pid 6: EPERM",)
    assert r.unseen[0].user == "bob" and r.time_wait == 2 and r.free is False and r.killable == [r.owners[0]]
    assert r.host == "node1" and json.loads(json.dumps(r.to_json())) == {k: v for k, v in raw.items() if k != "host"}
    assert parse_report("node1", report(dict(info, owners=[], unseen=[], free=True))).free is True
