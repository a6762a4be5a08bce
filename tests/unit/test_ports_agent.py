"""node_agent.ops.ports in-process against real holders: listeners, process trees, other users, TIME_WAIT."""

from __future__ import annotations

import io
import os
import pwd
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inventory import Host
from node_agent.host.runstate import alive
from node_agent.ops import ports
from orchestrator.remote.agent import call_agent
from orchestrator.remote.transport import LocalTransport
from tests.unit.ports_listeners import (
    LISTENER,
    NOBODY,
    SYSTEM_PYTHON,
    TIME_WAIT_MAKER,
    Listener,
    fake_torchrun_argv,
    listener_argv,
    listening,
    started,
    time_wait_port,
)


def kill(port: int, **extra: object) -> dict[str, Any]:
    return ports.kill_port({"op": "kill_port", "port": port, "proto": "tcp", "grace": 5.0, **extra}, io.BytesIO())


@pytest.fixture(params=["psutil", "proc"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every finding test runs with psutil and with the /proc fallback (a host without psutil)."""
    if request.param == "proc":
        monkeypatch.setattr(ports, "psutil", None)
    yield request.param


@pytest.mark.parametrize(("family", "proto", "status"), [("v4", "tcp", "LISTEN"), ("v6", "tcp", "LISTEN"),
                                                         ("v4", "udp", "BOUND"), ("v6", "udp", "BOUND")])
def test_finds_the_listener(backend: str, family: str, proto: str, status: str) -> None:
    if family == "v6" and not socket.has_ipv6:
        pytest.skip("no IPv6")
    with listening(family, proto) as ln:
        found = ports.find_owners(ln.port, proto)
        assert [o["pid"] for o in found["owners"]] == [ln.proc.pid]
        o = found["owners"][0]
        assert o["status"] == status and o["uid"] == os.getuid() and o["user"] == pwd.getpwuid(os.getuid()).pw_name
        assert o["laddr"].endswith(f":{ln.port}") and ("[::1]" in o["laddr"]) == (family == "v6")
        assert "-c" in o["cmdline"] and o["is_torchrun"] is False and o["ddpctl_job_id"] is None
        assert o["age_s"] is not None and o["age_s"] >= 0
        assert found["free"] is False
        assert ports.find_owners(ln.port, "udp" if proto == "tcp" else "tcp")["free"] is True


def test_connected_sockets_are_owners_too(backend: str) -> None:
    with listening() as ln, socket.create_connection(("127.0.0.1", ln.port)):
        found = ports.find_owners(ln.port)
        assert ln.proc.pid in [o["pid"] for o in found["owners"]]
        server = next(o for o in found["owners"] if o["pid"] == ln.proc.pid)
        assert server["status"] == "LISTEN"


def test_job_id_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPCTL_JOB_ID", "job-42")
    with listening() as ln:
        assert ports.find_owners(ln.port)["owners"][0]["ddpctl_job_id"] == "job-42"


def test_kills_the_listener_and_frees_the_port(backend: str) -> None:
    with listening() as ln:
        result = kill(ln.port)
        assert ln.gone()
        assert result["exit_code"] == 0 and result["free_after"] is True
        assert [(k["pid"], k["signal"], k["owner"]) for k in result["killed"]] == [(ln.proc.pid, "SIGTERM", True)]
        assert ports.find_owners(ln.port)["free"] is True


def test_kills_the_whole_tree() -> None:
    with listening(children=2) as ln:
        assert all(alive(p) for p in ln.children)
        result = kill(ln.port)
        assert ln.gone(), "children outlived their parent"
        assert sorted(k["pid"] for k in result["killed"]) == sorted(ln.pids)
        assert {k["pid"] for k in result["killed"] if k["owner"]} == {ln.proc.pid}


def test_a_torchrun_worker_takes_its_agent_and_siblings(tmp_path: Path) -> None:
    with started(fake_torchrun_argv(tmp_path)) as ln:
        worker = ln.children[0]
        owners = ports.find_owners(ln.port)["owners"]
        assert [o["pid"] for o in owners] == [worker] and owners[0]["ppid"] == ln.proc.pid
        result = kill(ln.port)
        assert ln.gone(), "torchrun agent or a worker survived"
        assert sorted(k["pid"] for k in result["killed"]) == sorted(ln.pids)


def test_sigkill_after_grace_for_a_process_ignoring_sigterm() -> None:
    stubborn = listener_argv()
    stubborn[2] = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + LISTENER
    with started(stubborn) as ln:
        result = kill(ln.port, grace=0.5)
        assert ln.gone()
        assert [k["signal"] for k in result["killed"]] == ["SIGKILL"] and result["free_after"] is True


def test_dry_run_kills_nothing() -> None:
    with listening(children=1) as ln:
        result = kill(ln.port, dry_run=True)
        assert result["killed"] == [] and result["free_after"] is None and result["free"] is False
        assert result["exit_code"] == 1
        assert all(alive(p) for p in ln.pids)


def test_expect_pids_limits_what_is_killed() -> None:
    with listening() as ln:
        result = kill(ln.port, expect_pids=[ln.proc.pid + 100000])
        assert alive(ln.proc.pid) and result["killed"] == []
        assert "not in the list you confirmed" in result["refused"][0]["reason"]
        assert result["exit_code"] == 1


def test_only_ddpctl_leaves_foreign_holders() -> None:
    with listening() as ln:
        result = kill(ln.port, only_ddpctl=True)
        assert alive(ln.proc.pid) and "not a process of a ddpctl job" in result["refused"][0]["reason"]


@pytest.fixture
def nobody_listener() -> Iterator[Listener]:
    """A listener run as `nobody` (needs root for setpriv, and a python `nobody` can read)."""
    if os.getuid() != 0 or not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"needs root and {SYSTEM_PYTHON}")
    with listening(python=SYSTEM_PYTHON, prefix=NOBODY) as ln:
        yield ln


def test_another_users_process_is_refused_without_force(nobody_listener: Listener) -> None:
    ln = nobody_listener
    owners = ports.find_owners(ln.port)["owners"]
    assert owners[0]["user"] == "nobody"
    result = kill(ln.port)
    assert alive(ln.proc.pid) and result["killed"] == []
    reason = result["refused"][0]["reason"]
    assert "nobody" in reason and "--force" in reason and result["exit_code"] == 1


def test_another_users_process_is_killed_with_force(nobody_listener: Listener) -> None:
    ln = nobody_listener
    result = kill(ln.port, force=True)
    assert ln.gone() and result["free_after"] is True


def test_time_wait_only_is_reported_not_killed(backend: str) -> None:
    port = time_wait_port()
    found = ports.find_owners(port)
    assert found["owners"] == [] and found["time_wait"] >= 1 and found["free"] is True
    assert 0 < found["time_wait_max_s"] <= 120
    result = kill(port)
    assert result["killed"] == [] and result["exit_code"] == 0 and result["time_wait"] >= 1
    assert result["bind_error"] is None


def test_a_time_wait_without_reuseaddr_is_not_free(backend: str) -> None:
    """Its TIME_WAIT refuses the SO_REUSEADDR bind torchrun's store makes: no holder, not free."""
    port = time_wait_port(reuse=False)
    found = ports.find_owners(port)
    assert found["owners"] == [] and found["time_wait"] >= 1
    assert found["free"] is False and "in use" in found["bind_error"]
    result = kill(port)
    assert result["killed"] == [] and result["exit_code"] == 1 and result["free"] is False


def test_a_kill_waits_for_the_port_to_bind_and_says_when_it_does_not() -> None:
    with started([sys.executable, "-c", TIME_WAIT_MAKER]) as ln:
        with socket.create_connection(("127.0.0.1", ln.port)) as cli:
            assert cli.recv(1) == b""  # the holder closed its side first: TIME_WAIT is its
        result = kill(ln.port)
        assert ln.gone() and [k["pid"] for k in result["killed"]] == [ln.proc.pid]
        assert result["after"] == [] and result["time_wait"] >= 1
        assert result["free_after"] is False and result["exit_code"] == 1 and "in use" in result["bind_error"]


def test_agent_without_psutil_over_the_wire() -> None:
    """The shipped agent under a python that has no psutil finds the holder through /proc."""
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"{SYSTEM_PYTHON} missing")
    transport = LocalTransport(Host(name="localhost", address="127.0.0.1", python=SYSTEM_PYTHON))
    with listening() as ln:
        reply = call_agent(transport, "port_owners", {"port": ln.port, "proto": "tcp"})
        assert [o["pid"] for o in reply.result["owners"]] == [ln.proc.pid]
        assert reply.result["owners"][0]["refusal"] is None
