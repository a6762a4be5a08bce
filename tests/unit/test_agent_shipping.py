"""The node agent ships over stdin and runs on any python3 >= 3.8 with nothing installed."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

import node_agent
from inventory import LOCALHOST
from orchestrator.errors import HostError
from orchestrator.remote.agent import agent_payload, call_agent, parse_reply
from orchestrator.remote.transport import CommandResult, LocalTransport


def find_python38() -> str | None:
    """A real 3.8 interpreter (pyenv's shim on PATH may only print advice)."""
    for candidate in [*sorted(Path("/root/.pyenv/versions").glob("3.8*/bin/python3.8")), "/usr/bin/python3.8"]:
        if Path(candidate).is_file():
            return str(candidate)
    return None


PY38 = find_python38()


def test_payload_carries_every_agent_module() -> None:
    import json
    import zlib

    header, blob = agent_payload().split(b"\n", 1)
    size, key = header.split()
    assert int(size) == len(blob) and len(key) == 20
    sources = json.loads(zlib.decompress(blob))
    modules = {p.stem for p in Path(node_agent.__file__).parent.glob("*.py")}
    assert {name.rsplit(".", 1)[-1] for name in sources} - {"node_agent"} == modules - {"__init__"}


def test_agent_runs_from_stdin_without_the_package_on_the_path(tmp_path: Path) -> None:
    reply = call_agent(LocalTransport(LOCALHOST), "ping")
    assert reply.result["protocol"] == 1
    assert reply.result["executable"]


def test_missing_configured_interpreter_falls_back_to_python3() -> None:
    host = replace(LOCALHOST, python="/nonexistent/bin/python")
    reply = call_agent(LocalTransport(host), "ping")
    assert reply.result["python"].startswith("3.")


@pytest.mark.skipif(PY38 is None, reason="no python3.8 on this machine")
def test_agent_ops_run_on_python_3_8() -> None:
    host = replace(LOCALHOST, python=str(PY38))
    t = LocalTransport(host)
    assert call_agent(t, "ping").result["python"].startswith("3.8")
    assert "free" in call_agent(t, "port_owners", {"port": 1}).result
    assert call_agent(t, "ps", {}).result == {"jobs": []} or "jobs" in call_agent(t, "ps", {}).result
    facts = call_agent(t, "facts", {"python": str(PY38), "workdir": "/tmp", "master_addr": "127.0.0.1",
                                    "master_port": 29500}).result
    assert "facts" in facts
    assert call_agent(t, "top", {"job": None, "interval": 0}).result["nodes"] == []
    assert call_agent(t, "stacks", {"job": "no-such-job"}).result["ranks"] == []


def test_unknown_op_and_garbage_become_host_errors() -> None:
    with pytest.raises(HostError, match="unknown op"):
        call_agent(LocalTransport(LOCALHOST), "no-such-op")
    garbage = CommandResult("h", ("x",), 1, "motd banner\n", "bash: python3: not found\n", 0.1)
    with pytest.raises(HostError, match="gave no result"):
        parse_reply(garbage)


def test_protocol_lines_are_separated_from_program_output() -> None:
    from node_agent.protocol import EVENT_PREFIX, RESULT_PREFIX

    out = f"hello\n{EVENT_PREFIX}{{\"event\": \"started\", \"pid\": 3}}\n{RESULT_PREFIX}{{\"x\": 1}}\n"
    reply = parse_reply(CommandResult("h", ("x",), 0, out, "", 0.1))
    assert reply.output == ["hello"] and reply.events[0]["pid"] == 3 and reply.result == {"x": 1}
    assert sys.executable  # the agent was exercised under this interpreter above


def _imported(argv: list[str], stdin: bytes) -> set[str]:
    """Modules a real interpreter imports running argv (its -X importtime report)."""
    import os
    import subprocess

    proc = subprocess.run(argv, input=stdin, capture_output=True, check=True,
                          env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    return {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


def test_a_workers_facts_op_imports_only_what_its_sub_facts_need() -> None:
    """Doctor runs the facts op on every host at once: psutil (the master port's owners), hashlib
    (a script's digest), concurrent.futures/logging, importlib.abc/util, typing and the idna codec are
    imports a worker without a script does not need."""
    from orchestrator.remote.agent import agent_argv, request_bytes

    request = {"python": sys.executable, "workdir": "/tmp", "master_addr": "127.0.0.1",
               "master_port": 29500, "check_port": False, "env_names": [], "env_prefixes": ["NCCL_"],
               "probe": {"ports": [0], "timeout": 10}}
    baseline = _imported([sys.executable, "-c", "pass"], b"")  # site's own (e.g. an editable install)
    agent = _imported(agent_argv(sys.executable), request_bytes("facts", request)) - baseline
    assert {"node_agent.torch_facts", "node_agent.probe"} <= agent  # it did run the op
    heavy = {"psutil", "hashlib", "concurrent.futures", "logging", "importlib.abc", "importlib.util",
             "encodings.idna", "platform", "pathlib", "dataclasses", "typing", "node_agent.ports",
             "node_agent.syncdest", "node_agent.runstate", "node_agent.procfs"}
    assert agent & heavy == set()


def test_the_agent_compiles_once_and_trusts_only_a_cache_its_user_alone_can_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import marshal
    import stat
    import zlib

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    t = LocalTransport(replace(LOCALHOST, python=sys.executable))
    assert call_agent(t, "ping").result["protocol"] == 1
    [cache] = (tmp_path / "ddpctl").glob("agent-*.bin")
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600

    # The next call runs the cached code objects, not its own compile: a changed copy shows.
    source = json.loads(zlib.decompress(agent_payload().split(b"\n", 1)[1]))["node_agent.__main__"][1]
    assert '"protocol": PROTOCOL_VERSION' in source
    codes = marshal.loads(cache.read_bytes())
    codes["node_agent.__main__"] = (False, marshal.dumps(compile(
        source.replace('"protocol": PROTOCOL_VERSION', '"protocol": 99'), "m", "exec")))
    cache.write_bytes(marshal.dumps(codes))
    assert call_agent(t, "ping").result["protocol"] == 99

    # Writable by its group: not trusted; the agent compiles and writes a fresh 0600 copy.
    cache.chmod(0o620)
    assert call_agent(t, "ping").result["protocol"] == 1
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert call_agent(t, "ping").result["protocol"] == 1

    # Another layout (code objects, not their bytes) and garbage are ignored; a copy for other
    # sources (an older ddpctl) goes when this one is written.
    cache.write_bytes(marshal.dumps({"node_agent.__main__": (False, compile("x = 1", "m", "exec"))}))
    assert call_agent(t, "ping").result["protocol"] == 1
    stale = cache.with_name("agent-" + "0" * 20 + cache.name[len("agent-") + 20:])
    stale.write_bytes(cache.read_bytes())
    cache.write_bytes(b"not marshal data")
    assert call_agent(t, "ping").result["protocol"] == 1
    assert sorted(p.name for p in (tmp_path / "ddpctl").iterdir()) == [cache.name]
