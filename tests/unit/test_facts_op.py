"""The facts, listen and connect ops on this machine (LocalTransport; no SSH, no cluster)."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from inventory import LOCALHOST
from node_agent.ops import facts, probe
from orchestrator.checks.gather import close_all
from orchestrator.remote.agent import AgentResult, call_agent, start_agent
from orchestrator.remote.session import Session
from orchestrator.remote.transport import LocalTransport
from orchestrator.remote.wire import parse_facts
from tests.unit.ports_listeners import listening


def request(tmp_path: Path, **over: Any) -> dict[str, Any]:
    base = {"python": sys.executable, "workdir": str(tmp_path), "script": "train.py",
            "master_addr": "127.0.0.1", "master_port": 29999, "check_port": True,
            "env_names": ["DDPCTL_TEST_VAR"], "env_prefixes": ["NCCL_"]}
    return {**base, **over}


def test_missing_interpreter_is_recorded_and_other_facts_still_come(tmp_path: Path) -> None:
    result = facts.gather(request(tmp_path, python="/nonexistent/python9"), sys.stdin.buffer)
    assert result["facts"]["python"]["found"] is None
    assert "not found" in result["errors"]["torch"]
    assert result["facts"]["workdir"]["exists"] is True
    assert result["facts"]["script"] == {"path": str(tmp_path / "train.py"), "exists": False}
    assert any(i["name"] == "lo" for i in result["facts"]["interfaces"])
    assert result["facts"]["resolution"]["master"][0]["address"] == "127.0.0.1"


def test_every_sub_fact_this_host_sends_fits_its_declaration(tmp_path: Path) -> None:
    """What the agent builds is what node_agent/wire/replies_facts.py declares: each sub-fact this machine
    answers decodes (none is malformed)."""
    (tmp_path / "train.py").write_bytes(b"pass\n")
    select = [n for n in facts.registry() if n not in ("torch", "prune")]  # importing torch takes seconds
    result = facts.gather(request(tmp_path, select=select, pick_port=True, ddpctl_lookup=True,
                                  checkpoint={"dir": "ck"}), sys.stdin.buffer)
    hf = parse_facts("here", result)
    assert [e for e in hf.errors.values() if "malformed" in e] == []
    assert hf.facts.python is not None and hf.facts.python.found == sys.executable
    assert hf.facts.workdir is not None and hf.facts.workdir.exists and hf.facts.script is not None
    assert hf.facts.checkpoint is not None and hf.facts.checkpoint.writable
    assert any(i.name == "lo" for i in hf.facts.interfaces or ()) and hf.facts.memlock is not None
    assert hf.resolution.master[0].address == "127.0.0.1" and hf.facts.time is not None
    assert hf.sent >= {"cpu_count", "gpu_count", "free_port", "env", "infiniband", "hostname_resolution"}


def test_a_crashing_sub_fact_becomes_an_error_string(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(req: dict[str, Any]) -> None:
        raise RuntimeError("ip exploded")

    monkeypatch.setattr(facts, "fact_interfaces", boom)
    result = facts.gather(request(tmp_path, python="/nonexistent/python9"), sys.stdin.buffer)
    assert result["errors"]["interfaces"] == "RuntimeError: ip exploded"
    assert "memlock" in result["facts"]


def test_script_checksum_and_busy_master_port(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_bytes(b"print('hi')\n")
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = facts.gather(request(tmp_path, python="/nonexistent/python9", master_port=port),
                              sys.stdin.buffer)
    script = result["facts"]["script"]
    assert script["sha256"] == hashlib.sha256(b"print('hi')\n").hexdigest()
    assert result["facts"]["master_port"]["bindable"] is False


def test_env_names_and_prefixes_are_read_from_the_host(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("DDPCTL_TEST_VAR", "1")
    monkeypatch.setenv("UNRELATED_VAR", "x")
    env = facts.fact_env(request(tmp_path))
    assert env["NCCL_DEBUG"] == "INFO" and env["DDPCTL_TEST_VAR"] == "1"
    assert "UNRELATED_VAR" not in env


@pytest.mark.torch
def test_torch_facts_come_from_the_interpreter_then_from_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = facts.fact_torch(request(tmp_path))
    assert first["importable"] is True and first["version"].startswith("2.")
    assert "cached" not in first
    assert len(list((tmp_path / "cache" / "ddpctl").glob("torch-facts-*.json"))) == 1
    second = facts.fact_torch(request(tmp_path))
    assert second.pop("cached") is True and second == first
    assert "cached" not in facts.fact_torch(request(tmp_path, no_cache=True))


def test_an_interpreter_without_torch_is_never_cached(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    venv = tmp_path / "bare"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python3"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S -I \"$@\"\n")
    python.chmod(0o755)
    got = facts.fact_torch(request(tmp_path, python=str(python)))
    assert got["importable"] is False and "torch" in got["error"]
    assert not (tmp_path / "cache" / "ddpctl").exists()


def start_session(op: str, args: dict[str, Any]) -> Session:
    session = Session("localhost", start_agent(LocalTransport(LOCALHOST), op, args))
    threading.Thread(target=session.pump, daemon=True).start()
    return session


def final_result(session: Session) -> dict[str, Any]:
    close_all([session])
    reply = session.wait_for("result", time.monotonic() + 10)
    assert isinstance(reply, AgentResult)
    return dict(reply.data)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # bound, never listening: connects are refused


def test_listen_then_connect_reports_ok_refused_and_peers() -> None:
    session = start_session("listen", {"ports": [0]})
    try:
        port = session.wait_for("listening", time.monotonic() + 30)["ports"][0]["port"]
        reply = call_agent(LocalTransport(LOCALHOST), "connect", {
            "targets": [f"127.0.0.1:{port}", f"127.0.0.1:{closed_port()}"], "timeout": 2})
    finally:
        result = final_result(session)
    ok, refused = reply.result["results"]
    assert (ok["ok"], ok["kind"]) == (True, "ok")
    assert (refused["ok"], refused["kind"]) == (False, "refused")
    assert result["ports"][0]["peers"] == ["127.0.0.1"]


def test_listen_reports_a_busy_port_and_still_listens_on_the_others() -> None:
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        busy = squatter.getsockname()[1]
        session = start_session("listen", {"ports": [busy, 0]})
        try:
            ports = session.wait_for("listening", time.monotonic() + 30)["ports"]
        finally:
            final_result(session)
    assert ports[0]["port"] is None and "in use" in ports[0]["error"]
    assert ports[1]["port"]


def test_the_facts_session_listens_sends_facts_then_dials_on_command(tmp_path: Path) -> None:
    session = start_session("facts", request(tmp_path, python="/nonexistent/python9",
                                             probe={"ports": [0], "timeout": 60}))
    try:
        deadline = time.monotonic() + 60
        port = session.wait_for("listening", deadline)["ports"][0]["port"]
        facts_event = session.wait_for("facts", deadline)
        session.send("CONNECT", {"targets": [f"127.0.0.1:{port}"], "timeout": 2})
        connected = session.wait_for("connected", deadline)
    finally:
        result = final_result(session)
    assert facts_event["facts"]["python"]["found"] is None
    assert connected["results"][0]["ok"] is True
    assert result["probe"]["ports"][0]["peers"] == ["127.0.0.1"]
    assert result["facts"]["hostname"] == facts_event["facts"]["hostname"]


def test_the_facts_session_dials_as_soon_as_told_while_it_still_gathers_its_facts(tmp_path: Path) -> None:
    session = start_session("facts", request(tmp_path, python="/nonexistent/python9", master_addr="127.0.0.1",
                                             probe={"ports": [0], "timeout": 60}))
    try:
        deadline = time.monotonic() + 60
        listening_event = session.wait_for("listening", deadline)
        port = listening_event["ports"][0]["port"]
        session.send("CONNECT", {"targets": [f"127.0.0.1:{port}"], "timeout": 2})  # before its facts
        connected = session.wait_for("connected", deadline)
        facts_event = session.wait_for("facts", deadline)
    finally:
        result = final_result(session)
    assert listening_event["source"] is None  # the master is this host: peers dial its address
    assert connected["results"][0]["ok"] is True
    assert facts_event["facts"]["python"]["found"] is None
    assert result["probe"]["ports"][0]["peers"] == ["127.0.0.1"]


@pytest.mark.parametrize("master", ["", "127.0.0.1", "localhost", "::1"])
def test_no_source_address_toward_a_master_on_this_host(master: str) -> None:
    assert (probe.source_toward(master) or ("",))[0] == ""


LAUNCH_SELECT = ["cpu_count", "gpu_count", "python", "workdir", "master_port", "free_port"]
TIMING = {"hostname", "elapsed_s", "time"}


@pytest.mark.parametrize(("over", "expected"), [
    ({"select": ["cpu_count", "workdir"]}, {"cpu_count", "workdir"}),
    ({"select": []}, set()),
    ({"select": ["hostname"]}, set()),
    ({"select": LAUNCH_SELECT, "check_port": False}, {"cpu_count", "gpu_count", "python", "workdir"}),
    ({"select": LAUNCH_SELECT, "pick_port": True}, {"cpu_count", "gpu_count", "python", "workdir", "master_port",
                                                    "free_port"}),
    ({"select": ["cpu_count"], "pick_port": True}, {"cpu_count"}),
    ({"pick_port": True}, None),
], ids=["two", "none", "hostname-only", "port-unchecked", "launch-auto-port", "pick-unselected", "doctor-set"])
def test_select_runs_only_the_named_sub_facts_whose_inputs_are_given(
        tmp_path: Path, over: dict[str, Any], expected: set[str] | None) -> None:
    """hostname always comes; master_port needs check_port, free_port needs pick_port, selected or not."""
    result = facts.gather(request(tmp_path, python="/nonexistent/python9", **over), sys.stdin.buffer)
    got = set(result["facts"]) | set(result["errors"])
    if expected is None:  # no select: doctor's whole set, with cpu_count and the picked port
        assert {"torch", "interfaces", "firewall", "memlock", "cpu_count", "free_port", "master_port"} <= got
        assert "gpu_count" not in got
    else:
        assert got == expected | TIMING


def test_launch_facts_answer_in_the_shape_the_launch_reads(tmp_path: Path) -> None:
    result = facts.gather(request(tmp_path, select=LAUNCH_SELECT, python=sys.executable, pick_port=True),
                          sys.stdin.buffer)
    got = result["facts"]
    assert result["errors"] == {}
    assert got["cpu_count"] == len(os.sched_getaffinity(0))
    assert isinstance(got["gpu_count"], int) and got["gpu_count"] >= 0
    assert got["python"]["found"] and got["workdir"]["exists"] is True
    with socket.socket() as s:
        s.bind(("127.0.0.1", got["free_port"]))  # the picked port is free


def test_an_unknown_selected_fact_is_an_error_not_a_crash(tmp_path: Path) -> None:
    result = facts.gather(request(tmp_path, select=["cpu_cnt", "workdir"]), sys.stdin.buffer)
    assert result["errors"] == {"cpu_cnt": "unknown fact"}
    assert result["facts"]["workdir"]["exists"] is True


def test_a_select_that_is_not_a_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="select must be a list"):
        facts.gather(request(tmp_path, select="cpu_count"), sys.stdin.buffer)


def write_state(root: Path, job_id: str, status: str, supervisor_pid: int) -> None:
    path = root / "runs" / job_id / "node0"
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"job_id": job_id, "hostname": socket.gethostname(),
                                                 "status": status, "supervisor_pid": supervisor_pid}))


@pytest.mark.parametrize(("status", "supervisor", "live"), [
    ("running", "me", True),
    ("exited", "me", False),
    ("running", "gone", False),
    (None, "me", False),
], ids=["supervised", "exited", "supervisor-gone", "no-state"])
def test_a_master_port_owner_is_job_live_only_while_its_supervisor_runs_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str | None, supervisor: str, live: bool) -> None:
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setenv("DDPCTL_JOB_ID", "job-live-1")  # the listener inherits it
    if status is not None:
        write_state(tmp_path / "state", "job-live-1", status, os.getpid() if supervisor == "me" else dead_pid())
    with listening() as ln:
        result = facts.gather(request(tmp_path, select=["master_port"], master_port=ln.port), sys.stdin.buffer)
    fact = result["facts"]["master_port"]
    assert fact["bindable"] is False
    assert [(o["pid"], o["ddpctl_job_id"], o["job_live"]) for o in fact["owners"]] == [
        (ln.proc.pid, "job-live-1", live)]


def test_an_owner_outside_any_job_is_never_job_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDPCTL_JOB_ID", raising=False)
    with listening() as ln:
        result = facts.gather(request(tmp_path, select=["master_port"], master_port=ln.port), sys.stdin.buffer)
    assert [o["job_live"] for o in result["facts"]["master_port"]["owners"]] == [False]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


@pytest.mark.parametrize(("nvidia_smi", "expected"), [
    ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-b)\n", 2),
    (RuntimeError("nvidia-smi -L exited 9: NVIDIA-SMI has failed because it couldn't communicate with the driver"), 0),
    (FileNotFoundError("nvidia-smi: command not found"), 0),
], ids=["two", "driver-broken", "no-nvidia-smi"])
def test_gpu_count_without_the_driver_directory_asks_nvidia_smi(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nvidia_smi: str | Exception, expected: int) -> None:
    monkeypatch.setattr(facts, "NVIDIA_GPUS", tmp_path / "no-driver" / "gpus")

    def fake_run(argv: list[str], timeout: float = 0.0) -> str:
        assert argv == ["nvidia-smi", "-L"]
        if isinstance(nvidia_smi, Exception):
            raise nvidia_smi
        return nvidia_smi

    monkeypatch.setattr(facts, "run", fake_run)
    assert facts.fact_gpu_count({}) == expected


def test_each_gpu_process_comes_with_its_user_and_ddpctl_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded nvidia-smi output naming a real process of this machine (started with a job id) and a
    pid this machine does not have (another container's): the first gets its user and job, the other
    None for both."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                             env={**os.environ, "DDPCTL_JOB_ID": "other-job-1"})
    gone = dead_pid()
    outputs = {"--query-gpu": "0, GPU-a, NVIDIA H100 80GB HBM3, 81559, 2300\n"
                              "1, GPU-b, NVIDIA H100 80GB HBM3, 81559, 0\n",
               "--query-compute-apps": f"GPU-a, {child.pid}, /usr/bin/python3, 1200\nGPU-a, {gone}, python, 1100\n"}

    def fake_run(argv: list[str], timeout: float = 0.0) -> str:
        assert argv[0] == "nvidia-smi"
        return outputs[argv[1].split("=")[0]]

    monkeypatch.setattr(facts.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(facts, "run", fake_run)
    try:
        got = facts.fact_gpus({})
    finally:
        child.communicate(b"", timeout=30)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert got is not None and got["user"] == me
    assert [g["index"] for g in got["gpus"]] == [0, 1]
    assert [(a["pid"], a["user"], a["ddpctl_job_id"]) for a in got["apps"]] == [
        (child.pid, me, "other-job-1"), (gone, None, None)]


def test_one_connect_round_dials_every_target_from_one_thread_and_keeps_their_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from node_agent.ops.probe import connect_all

    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread)
        real_start(thread)

    with socket.socket() as server, socket.socket() as full:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        full.bind(("127.0.0.1", 0))
        full.listen(0)  # its accept queue fills at once: later SYNs are dropped, the dial times out
        filler = socket.create_connection(full.getsockname(), 2)
        targets = [f"127.0.0.1:{server.getsockname()[1]}", f"127.0.0.1:{closed_port()}",
                   f"127.0.0.1:{full.getsockname()[1]}", "127.0.0.1:not-a-port",
                   f"[::1]:{closed_port()}" if socket.has_ipv6 else f"127.0.0.1:{closed_port()}"]
        monkeypatch.setattr(threading.Thread, "start", start)
        results = connect_all(targets, 1.0)
        monkeypatch.undo()
        filler.close()
    assert started == []  # no thread per target
    assert [r["target"] for r in results] == targets
    assert [r["kind"] for r in results[:4]] == ["ok", "refused", "timeout", "error"]
    assert results[0]["local"] == "127.0.0.1" and results[0]["ok"] is True
    assert results[1]["error"] == "[Errno 111] Connection refused"  # create_connection's words
    assert results[2]["error"] == "timed out"
    assert results[4]["ok"] is False
