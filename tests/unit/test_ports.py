"""node_agent.ops.ports against the real kernel: /proc/net parsing, rule precedence, tree bounds, unseen holders."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.host.runstate import alive
from node_agent.ops import ports
from tests.unit.ports_listeners import NOBODY, SYSTEM_PYTHON, fake_torchrun_argv, listening, reap, started, wait_until

ROOT = Path(__file__).resolve().parents[2]
ME = 1000

# Leads its own process group (started with start_new_session); its one child runs as `nobody`.
GROUP_LEADER = """
import socket, subprocess, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
kid = subprocess.Popen(sys.argv[1:] + ["-c", "import time; time.sleep(600)"])
print(s.getsockname()[1], kid.pid, flush=True)
time.sleep(600)
"""


def needs_root_and_system_python() -> None:
    if os.getuid() != 0 or not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"needs root (setpriv) and {SYSTEM_PYTHON} (readable by nobody)")


@pytest.mark.parametrize(("family", "host", "shown"), [(socket.AF_INET, "127.0.0.1", "127.0.0.1"),
                                                       (socket.AF_INET6, "::1", "[::1]")], ids=["tcp", "tcp6"])
def test_parse_proc_net_reads_the_kernels_own_table(family: int, host: str, shown: str) -> None:
    """The hand-decoded byte order agrees with the kernel: address, port, LISTEN, uid and the socket inode."""
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6")
    with socket.socket(family) as s:
        s.bind((host, 0))
        s.listen()
        port = s.getsockname()[1]
        table = Path("/proc/net/tcp6" if family == socket.AF_INET6 else "/proc/net/tcp").read_text()
        got = ports.parse_proc_net(table, port)
        assert [(x["laddr"], x["status"], x["uid"], x["inode"]) for x in got] == [
            (f"{shown}:{port}", "LISTEN", os.getuid(), os.fstat(s.fileno()).st_ino)]


def test_parse_proc_net_reads_both_ends_of_a_real_connection() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as cli:
            conn, _ = srv.accept()
            with conn:
                cport = cli.getsockname()[1]
                got = ports.parse_proc_net(Path("/proc/net/tcp").read_text(), port)
                assert sorted((x["status"], x["raddr"]) for x in got) == [
                    ("ESTABLISHED", f"127.0.0.1:{cport}"), ("LISTEN", "0.0.0.0:0")]


@pytest.mark.parametrize(("o", "force", "only_ddpctl", "expect", "reason"), [
    ({"pid": 1, "uid": ME, "name": "init"}, False, False, None, "pid 1"),
    ({"pid": 77, "uid": ME, "name": "python3"}, False, False, None, "ddpctl's own session"),
    ({"pid": 50, "uid": ME, "name": "python3"}, True, False, [51], "not in the list you confirmed"),
    ({"pid": 50, "uid": 0, "name": "python3", "ddpctl_job_id": None}, True, True, None, "not a process of a ddpctl"),
    ({"pid": 50, "uid": ME, "name": "python3", "ddpctl_job_id": ""}, False, True, None, "not a process of a ddpctl"),
    ({"pid": 50, "uid": 0, "user": "root", "name": "sshd"}, False, False, None, "belongs to user root"),
    ({"pid": 50, "uid": 0, "name": "sshd", "ddpctl_job_id": "j"}, True, True, [50], None),
    ({"pid": 50, "uid": ME, "name": "chronyd"}, False, False, (50,), "system service"),
], ids=["pid1", "ancestor", "expect-beats-force", "only-ddpctl-beats-force", "empty-job-id", "uid-before-name",
        "all-passed", "expect-tuple"])
def test_refusal_precedence(o: dict[str, Any], force: bool, only_ddpctl: bool, expect: Any,
                            reason: str | None) -> None:
    """--force lifts only the user and system-service rules, never pid 1, ancestors, expect or only_ddpctl."""
    got = ports.refusal(o, ME, {77}, force, only_ddpctl, expect)
    assert got is None if reason is None else (got is not None and reason in got), got


def test_process_tree_skips_protected_pids_and_their_subtrees() -> None:
    with listening(children=2) as ln:
        owner = {"pid": ln.proc.pid, "ppid": os.getpid()}
        assert sorted(ports.process_tree(owner, set())) == sorted(ln.pids)
        assert sorted(ports.process_tree(owner, {ln.children[0]})) == [ln.proc.pid, ln.children[1]]


def test_a_torchrun_workers_tree_is_its_agents_unless_the_agent_is_protected(tmp_path: Path) -> None:
    with started(fake_torchrun_argv(tmp_path)) as ln:  # agent (a script named torchrun), worker 0 holds the port
        worker = ln.children[0]
        owner = {"pid": worker, "ppid": ln.proc.pid}
        assert sorted(ports.process_tree(owner, set())) == sorted(ln.pids)
        assert ports.process_tree(owner, {ln.proc.pid}) == [worker]


@pytest.mark.parametrize("cmdline", [
    ["/usr/bin/python3", "-u", "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py"],
    ["python3", "-X", "faulthandler", "-m", "torch.distributed.run", "train.py"],
    ["python3", "-mtorch.distributed.run", "train.py"],
    ["python", "-m", "torch.distributed.launch", "--nproc_per_node=2", "train.py"],
], ids=["python-u", "python-X", "python-mjoined", "launch"])
def test_torchrun_is_recognised_after_interpreter_options(cmdline: list[str]) -> None:
    """An agent started as `python -u -m torch.distributed.run` (or the deprecated
    torch.distributed.launch, which runs the same elastic agent in-process) is torchrun too: otherwise
    killing a worker that holds the port leaves the agent and the sibling workers running."""
    assert ports.is_torchrun(cmdline) is True


def test_a_holder_this_user_cannot_see_is_not_reported_free() -> None:
    """A caller that cannot read another user's /proc/<pid>/fd (any non-root user on a shared host)
    must not be told the port is free: the LISTEN row of /proc/net/tcp is reported as unseen."""
    needs_root_and_system_python()
    with listening() as ln:  # held by root, looked at by nobody
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from node_agent.ops import ports; "
                "print(json.dumps(ports.find_owners(int(sys.argv[2]))))")
        run = subprocess.run([*NOBODY, SYSTEM_PYTHON, "-c", code, str(ROOT), str(ln.port)],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        found = json.loads(run.stdout)
        assert alive(ln.proc.pid)
        assert found["free"] is False, f"port {ln.port} held by root pid {ln.proc.pid} reported free: {found}"
        assert [(u["status"], u["user"]) for u in found["unseen"]] == [("LISTEN", "root")]


@contextlib.contextmanager
def group_leader_with_a_nobody_child() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    proc = subprocess.Popen([sys.executable, "-c", GROUP_LEADER, *NOBODY, SYSTEM_PYTHON], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    kid = 0
    try:
        assert proc.stdout is not None
        port, kid = (int(w) for w in proc.stdout.readline().split())
        wait_until(lambda: Path(f"/proc/{kid}").stat().st_uid != 0, what="the child to become nobody")
        yield proc, port, kid
    finally:
        reap(proc, [kid] if kid else [])


def test_without_force_another_users_child_in_the_owners_group_survives() -> None:
    """Without --force other users' processes are left out of the tree, so the owner's own process
    group must not be signalled as a whole (os.killpg would reach them: root can)."""
    needs_root_and_system_python()
    with group_leader_with_a_nobody_child() as (proc, port, kid):
        result = ports.kill_port({"op": "kill_port", "port": port, "grace": 5.0}, io.BytesIO())
        assert result["free_after"] is True and not alive(proc.pid)
        assert kid not in [k["pid"] for k in result["killed"]]
        assert alive(kid), "nobody's child was killed without --force"


def test_with_force_another_users_child_in_the_tree_is_killed_and_listed() -> None:
    needs_root_and_system_python()
    with group_leader_with_a_nobody_child() as (proc, port, kid):
        result = ports.kill_port({"op": "kill_port", "port": port, "grace": 5.0, "force": True}, io.BytesIO())
        assert result["free_after"] is True and not alive(proc.pid) and not alive(kid)
        assert sorted(k["pid"] for k in result["killed"]) == sorted([proc.pid, kid])
