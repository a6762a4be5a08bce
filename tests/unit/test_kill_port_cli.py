"""`ddpctl kill-port` through typer's CliRunner against real local holders: exit codes, output, JSON."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inventory import LOCALHOST, Host
from node_agent.host.runstate import alive
from orchestrator.cli import app
from orchestrator.commands import kill_port
from orchestrator.hostops.killport import free_port
from orchestrator.remote.pool import make_pool
from orchestrator.remote.ssh_options import Connection
from tests.unit.ports_listeners import (
    NOBODY,
    SYSTEM_PYTHON,
    fake_torchrun_argv,
    listening,
    started,
    time_wait_port,
)

runner = CliRunner()


def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(f'[defaults]\npython = {json.dumps(sys.executable)}\n\n'
                    '[[hosts]]\nname = "here"\naddress = "127.0.0.1"\n\n'
                    '[[hosts]]\nname = "node1"\naddress = "198.18.0.11"\n')
    return path


@pytest.mark.parametrize("port", ["0", "65536", "-3", "http"])
def test_bad_port_is_exit_2(port: str) -> None:
    result = runner.invoke(app, ["kill-port", "--", port] if port.startswith("-") else ["kill-port", port])
    assert result.exit_code == 2, result.output


def test_a_host_without_an_inventory_is_reached_as_ssh_would() -> None:
    """The fix doctor and `up` print for a held master port (`ddpctl kill-port 29500 --host node0`)
    runs as printed: the name is an ssh destination (ssh_config applies), once each."""
    from orchestrator.commands.kill_port import select_hosts

    assert select_hosts(None, ["node1", "gpu-a", "node1"], False) == [Host("node1", "node1"), Host("gpu-a", "gpu-a")]


def test_unknown_host_is_exit_2_with_a_suggestion(tmp_path: Path) -> None:
    result = runner.invoke(app, ["kill-port", "29500", "-i", str(inventory(tmp_path)), "--host", "nod1"])
    assert result.exit_code == 2
    assert "nod1" in result.output and "did you mean node1" in result.output


def test_free_port_is_exit_0() -> None:
    with listening() as ln:
        port = ln.port
    result = runner.invoke(app, ["kill-port", str(port), "--yes"])
    assert result.exit_code == 0, result.output
    assert f"localhost: port {port} is free" in result.output


def test_dry_run_shows_and_kills_nothing() -> None:
    with listening(children=1) as ln:
        result = runner.invoke(app, ["kill-port", str(ln.port), "--dry-run", "--yes"])
        assert result.exit_code == 1, result.output
        assert all(alive(p) for p in ln.pids)
        assert str(ln.proc.pid) in result.output and "held, nothing killed" in result.output
        assert "killed pid" not in result.output


def test_yes_kills_and_reports_free() -> None:
    with listening(children=1) as ln:
        result = runner.invoke(app, ["kill-port", str(ln.port), "--yes", "--grace", "2"])
        assert result.exit_code == 0, result.output
        assert ln.gone()
        assert f"killed pid {ln.proc.pid} (SIGTERM)" in result.output
        assert f"killed pid {ln.children[0]} (SIGTERM) [tree]" in result.output
        assert f"port {ln.port} is now free" in result.output


def test_not_a_terminal_without_yes_refuses_to_kill() -> None:
    with listening() as ln:
        result = runner.invoke(app, ["kill-port", str(ln.port)])
        assert result.exit_code == 1
        assert alive(ln.proc.pid) and "--yes" in result.output


@pytest.mark.parametrize(("answer", "killed"), [("y\n", True), ("n\n", False)])
def test_terminal_confirmation(monkeypatch: pytest.MonkeyPatch, answer: str, killed: bool) -> None:
    monkeypatch.setattr(kill_port, "stdin_is_terminal", lambda: True)
    with listening() as ln:
        result = runner.invoke(app, ["kill-port", str(ln.port)], input=answer)
        assert "kill 1 process(es)" in result.output
        assert result.exit_code == (0 if killed else 1), result.output
        assert ln.gone() is killed


def test_inventory_host_at_this_address_acts_without_ssh(tmp_path: Path) -> None:
    with listening() as ln:
        result = runner.invoke(app, ["kill-port", str(ln.port), "-i", str(inventory(tmp_path)), "--host", "here",
                                     "--yes"])
        assert result.exit_code == 0, result.output
        assert ln.gone() and f"here: port {ln.port} is now free" in result.output


def test_json_output_shape() -> None:
    with listening() as ln:
        result = runner.invoke(app, ["kill-port", str(ln.port), "--json", "--yes"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["port"] == ln.port and data["exit_code"] == 0 and data["failed"] == {}
        host = data["hosts"]["localhost"]
        assert host["owners"][0]["pid"] == ln.proc.pid and host["owners"][0]["refusal"] is None
        assert host["killed"][0]["pid"] == ln.proc.pid and host["free_after"] is True


def test_json_dry_run_lists_owners_only() -> None:
    with listening() as ln:
        result = runner.invoke(app, ["kill-port", str(ln.port), "--json", "--dry-run"])
        data = json.loads(result.stdout)
        assert result.exit_code == 1 and data["exit_code"] == 1 and alive(ln.proc.pid)
        assert [o["pid"] for o in data["hosts"]["localhost"]["owners"]] == [ln.proc.pid]
        assert data["hosts"]["localhost"]["killed"] == []


def test_time_wait_only_is_reported_not_killed() -> None:
    port = time_wait_port()
    result = runner.invoke(app, ["kill-port", str(port), "--yes"])
    assert result.exit_code == 0, result.output
    assert "TIME_WAIT" in result.output and "SO_REUSEADDR" in result.output and "nothing to kill" in result.output
    assert "killed pid" not in result.output


def test_a_time_wait_that_refuses_the_bind_is_not_called_free() -> None:
    port = time_wait_port(reuse=False)  # its listener did not set SO_REUSEADDR: torchrun's store cannot bind
    result = runner.invoke(app, ["kill-port", str(port), "--yes"])
    assert result.exit_code == 1, result.output
    assert f"port {port} has no process, yet it does not bind" in result.output
    assert "did not set SO_REUSEADDR" in result.output and "use another port" in result.output
    assert "killed pid" not in result.output and "nothing to kill" not in result.output


def test_other_users_process_refused_then_forced() -> None:
    if os.getuid() != 0 or not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"needs root and {SYSTEM_PYTHON}")
    with listening(python=SYSTEM_PYTHON, prefix=NOBODY) as ln:
        refused = runner.invoke(app, ["kill-port", str(ln.port), "--yes"])
        assert refused.exit_code == 1 and alive(ln.proc.pid)
        assert f"refusing pid {ln.proc.pid} (nobody)" in refused.output and "--force" in refused.output
        forced = runner.invoke(app, ["kill-port", str(ln.port), "--yes", "--force"])
        assert forced.exit_code == 0, forced.output
        assert ln.gone()


@pytest.mark.parametrize("port", ["70000", "99999"])
def test_port_above_65535_is_exit_2(port: str) -> None:
    result = runner.invoke(app, ["kill-port", port])
    assert result.exit_code == 2 and "65535" in result.output, result.output


def test_all_without_an_inventory_names_the_inventory_option() -> None:
    result = runner.invoke(app, ["kill-port", "29601", "--all"])
    assert result.exit_code == 2 and "--inventory" in result.output and "Traceback" not in result.output


def test_json_off_a_terminal_without_yes_kills_nothing() -> None:
    with listening() as ln:
        result = runner.invoke(app, ["kill-port", str(ln.port), "--json"])
        assert result.exit_code == 1 and alive(ln.proc.pid)
        data = json.loads(result.stdout)
        assert data["exit_code"] == 1 and [o["pid"] for o in data["hosts"]["localhost"]["owners"]] == [ln.proc.pid]
        assert "--yes" in result.stderr


def test_job_id_is_shown_in_the_table_and_the_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPCTL_JOB_ID", "kp-job-7")
    with listening() as ln:
        shown = runner.invoke(app, ["kill-port", str(ln.port), "--dry-run"])
        assert "kp-job-7" in shown.output, shown.output
        data = json.loads(runner.invoke(app, ["kill-port", str(ln.port), "--dry-run", "--json"]).stdout)
        assert data["hosts"]["localhost"]["owners"][0]["ddpctl_job_id"] == "kp-job-7"
        assert alive(ln.proc.pid)


def test_a_torchrun_worker_takes_its_agent_and_siblings(tmp_path: Path) -> None:
    with started(fake_torchrun_argv(tmp_path)) as ln:  # agent (a script named torchrun); worker 0 holds the port
        worker, sibling = ln.children
        result = runner.invoke(app, ["kill-port", str(ln.port), "--yes", "--json"])
        assert result.exit_code == 0, result.output
        host = json.loads(result.stdout)["hosts"]["localhost"]
        assert [o["pid"] for o in host["owners"]] == [worker]
        assert sorted(k["pid"] for k in host["killed"]) == sorted([ln.proc.pid, worker, sibling])
        assert [k["pid"] for k in host["killed"] if k["owner"]] == [worker]
        assert ln.gone(), "the torchrun agent or a sibling worker survived"


def test_the_table_says_a_torchrun_workers_whole_tree_goes(tmp_path: Path) -> None:
    """What the user confirms must match what is killed: a worker under torchrun takes its agent
    and the sibling workers, so its row must not read "kill (+ children)"."""
    with started(fake_torchrun_argv(tmp_path)) as ln:
        result = runner.invoke(app, ["kill-port", str(ln.port), "--dry-run"])
        assert result.exit_code == 1 and all(alive(p) for p in ln.pids)
        assert "torchrun" in result.output and "+ children" not in result.output, result.output


def test_free_port_with_only_ddpctl_leaves_a_foreign_holder() -> None:
    """free_port(only_ddpctl=True) (what `ddpctl down` uses) refuses a process outside any ddpctl job."""
    with listening() as ln, make_pool(Connection()) as pool:
        report = free_port(pool, [LOCALHOST], ln.port, only_ddpctl=True).succeeded["localhost"]
        assert alive(ln.proc.pid) and report.killed == () and report.free is False
        assert [r.pid for r in report.refused] == [ln.proc.pid]
        assert "not a process of a ddpctl job" in report.refused[0].reason


def test_a_holder_the_caller_cannot_see_is_held_not_free(tmp_path: Path) -> None:
    """The whole command as an unprivileged user (the agent's python runs as nobody) on a port root
    listens on: reported held by a process it cannot see, nothing killed, exit 1 (never "free")."""
    if os.getuid() != 0 or not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"needs root and {SYSTEM_PYTHON}")
    wrapper = tmp_path / "python-as-nobody"
    wrapper.write_text(f'#!/bin/sh\nexec {" ".join(NOBODY)} {SYSTEM_PYTHON} "$@"\n')
    wrapper.chmod(0o755)
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f'[[hosts]]\nname = "asnobody"\naddress = "127.0.0.1"\npython = {json.dumps(str(wrapper))}\n')
    with listening() as ln:
        base = ["kill-port", str(ln.port), "-i", str(hosts), "--host", "asnobody", "--yes"]
        result = runner.invoke(app, base)
        assert result.exit_code == 1 and alive(ln.proc.pid), result.output
        assert "user root" in result.output and "cannot see" in result.output
        assert f"port {ln.port} is free" not in result.output and "killed pid" not in result.output
        data = json.loads(runner.invoke(app, [*base, "--json"]).stdout)
        host = data["hosts"]["asnobody"]
        assert data["exit_code"] == 1 and host["owners"] == [] and host["unseen"][0]["user"] == "root"


@pytest.mark.parametrize(("family", "proto", "flags"), [("v4", "udp", ["--udp"]), ("v6", "tcp", [])])
def test_udp_and_ipv6_holders_are_killed(family: str, proto: str, flags: list[str]) -> None:
    with listening(family, proto, children=1) as ln:
        other = runner.invoke(app, ["kill-port", str(ln.port), "--yes", *(["--udp"] if not flags else [])])
        assert other.exit_code == 0 and alive(ln.proc.pid), other.output  # the other protocol: nothing held
        result = runner.invoke(app, ["kill-port", str(ln.port), "--yes", *flags])
        assert result.exit_code == 0, result.output
        assert ln.gone() and f"port {ln.port} is now free" in result.output
