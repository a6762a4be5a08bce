"""The node agent ships over stdin and runs on any python3 >= 3.8 with nothing installed."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import zlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from doctor_fixtures import doctor_here

import node_agent
from inventory import LOCALHOST, Host
from orchestrator.checks.model import CheckStatus, DoctorContext
from orchestrator.errors import HostError
from orchestrator.remote.agent import (
    AgentResult,
    AgentStream,
    agent_code,
    agent_payload,
    call_agent,
    keyed_request,
    parse_reply,
    start_agent,
)
from orchestrator.remote.programs import SHIPPED, module_of
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
    assert int(size) == len(blob) and len(key) == 32
    sources = json.loads(zlib.decompress(blob))
    root = Path(node_agent.__file__).parent
    modules = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
               for p in root.rglob("*.py")}
    programs = {module_of(rel) for rel in SHIPPED}  # the train_jobs programs doctor runs travel with it
    assert set(sources) == modules | programs and {"node_agent.ops.facts", "node_agent.wire.protocol"} <= modules
    assert {"train_jobs.smoke", "train_jobs.allreduce_bench.bench", "train_jobs.hostcheck.check"} <= programs
    assert {name for name, (package, _) in sources.items() if package} == {
        "node_agent", "node_agent.host", "node_agent.ops", "node_agent.rank", "node_agent.runtime", "node_agent.wire",
        "train_jobs", "train_jobs.allreduce_bench", "train_jobs.hostcheck"}


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
    from node_agent.wire.protocol import EVENT_PREFIX, RESULT_PREFIX

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
    assert {"node_agent.ops.torch_facts", "node_agent.ops.probe"} <= agent  # it did run the op
    heavy = {"psutil", "hashlib", "concurrent.futures", "logging", "importlib.abc", "importlib.util",
             "encodings.idna", "platform", "pathlib", "dataclasses", "typing", "node_agent.ops.ports",
             "node_agent.ops.syncdest", "node_agent.host.runstate", "node_agent.host.procfs"}
    assert agent & heavy == set()


def _call(t: LocalTransport, op: str = "ping") -> tuple[Mapping[str, Any], AgentStream]:
    """One op through a held stream (what call_agent does), to see what the host's cache did."""
    stream = start_agent(t, op, {})
    stream.close_stdin()
    result = next(m for m in stream.messages() if isinstance(m, AgentResult))
    assert stream.wait(30) == 0
    return result.data, stream


@pytest.fixture
def cached_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalTransport:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    return LocalTransport(replace(LOCALHOST, python=sys.executable))


def _rewrite(cache: Path, body: bytes, *, digest: bytes | None = None) -> None:
    """The cache file with another body, under the hash the bootstrap checks (or `digest`)."""
    from hashlib import blake2b

    head = cache.read_bytes().split(b"\n", 1)[0].split()
    digest = digest or blake2b(body, digest_size=16).hexdigest().encode()
    cache.write_bytes(b" ".join([head[0], head[1], digest]) + b"\n" + body)


def test_a_host_gets_the_agent_once_then_runs_it_from_its_cache_by_key(cached_host: LocalTransport,
                                                                      tmp_path: Path) -> None:
    """The first call sends the key, hears the host lacks it and sends the sources on the same
    channel; the host writes its compiled copy 0600 under the key. The next call sends the key and
    the request alone (no sources), and the host runs what it cached: a changed copy shows."""
    import marshal
    import stat

    result, first = _call(cached_host)
    assert result["protocol"] == 1 and first.shipped and (first.cache, first.stored) == ("absent", "written")
    [cache] = (tmp_path / "ddpctl").glob("agent-*.bin")
    assert cache.name.startswith(f"agent-{agent_code()[0]}-") and stat.S_IMODE(cache.stat().st_mode) == 0o600
    result, second = _call(cached_host)
    assert result["protocol"] == 1 and not second.shipped and second.cache == "cached"
    assert len(keyed_request("ping", {})) < 100 < len(agent_code()[1]) // 100

    blob, codes = marshal.loads(cache.read_bytes().split(b"\n", 1)[1])
    source = codes_source = json.loads(zlib.decompress(blob))["node_agent.__main__"][1]
    assert '"protocol": PROTOCOL_VERSION' in codes_source
    codes["node_agent.__main__"] = (False, marshal.dumps(compile(
        source.replace('"protocol": PROTOCOL_VERSION', '"protocol": 99'), "m", "exec")))
    _rewrite(cache, marshal.dumps((blob, codes)))
    assert _call(cached_host)[0]["protocol"] == 99


@pytest.mark.parametrize(("spoil", "state"), [
    ("edited", "damaged: its content does not match its hash"),
    ("group-writable", "not trusted: others may write it"),
    ("garbage under its own hash", "unreadable: "),
])
def test_a_cache_file_that_is_damaged_or_others_may_write_is_replaced(
        cached_host: LocalTransport, tmp_path: Path, spoil: str, state: str) -> None:
    """Checked against its hash and its mode before it runs: the host says so, the call sends the
    sources, and a good 0600 copy replaces it."""
    import stat

    _call(cached_host)
    [cache] = (tmp_path / "ddpctl").glob("agent-*.bin")
    good = cache.read_bytes()
    if spoil == "edited":
        cache.write_bytes(good.replace(b"PROTOCOL_VERSION", b"PROTOCOL_VERSIOM", 1))
        assert cache.read_bytes() != good
    elif spoil == "group-writable":
        cache.chmod(0o620)
    else:
        _rewrite(cache, b"not marshal data")
    result, stream = _call(cached_host)
    assert result["protocol"] == 1 and stream.shipped and stream.cache.startswith(state)
    assert stream.stored == "written"
    assert cache.read_bytes() == good and stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert not _call(cached_host)[1].shipped


def test_two_versions_side_by_side_keep_their_caches_and_an_old_unused_one_goes(
        cached_host: LocalTransport, tmp_path: Path) -> None:
    """Two ddpctl versions calling one host each keep their copy (neither thrashes the other); a
    copy unused for 14 days goes when a new one is written."""
    import os
    import time

    folder = tmp_path / "ddpctl"
    folder.mkdir(mode=0o700)
    other = folder / "agent-0123456789abcdef0123456789abcdef-cpython-311-30b07f0.bin"
    stale = folder / "agent-fedcba9876543210fedcba9876543210-cpython-311-30b07f0.bin"
    for path in (other, stale):
        path.write_bytes(b"another version's copy")
    month_ago = time.time() - 30 * 86400
    os.utime(stale, (month_ago, month_ago))
    assert _call(cached_host)[1].shipped
    mine = [p for p in folder.iterdir() if p not in (other, stale)]
    assert sorted(p.name for p in folder.iterdir()) == sorted([other.name, *(p.name for p in mine)])
    assert len(mine) == 1 and not _call(cached_host)[1].shipped


CANNOT_WRITE = [
    ("read-only", "mount -t tmpfs -o ro,size=1m tmpfs \"$C\"", "not written: Read-only file system"),
    ("full", "mount -t tmpfs -o size=64k tmpfs \"$C\" && mkdir -m 700 \"$C/ddpctl\" && "
             "head -c 60k /dev/zero > \"$C/fill\"", "not written: No space left on device"),
]


def python_with_cache_on(tmp_path: Path, cache: Path, mount: str) -> Path:
    """An interpreter (a wrapper around this one) whose cache directory `cache` is what `mount`
    makes of it, in a mount namespace of its own: the mount never reaches this machine."""
    cache.mkdir()
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n"
                      f"export C={shlex.quote(str(cache))} XDG_CACHE_HOME={shlex.quote(str(cache))}\n"
                      f'exec unshare -m sh -c \'{mount} && exec "$0" "$@"\' {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    return python


@pytest.mark.skipif(shutil.which("unshare") is None or os.getuid() != 0, reason="needs root and unshare")
@pytest.mark.parametrize(("disk", "mount", "state"), CANNOT_WRITE)
def test_a_cache_on_a_read_only_or_full_disk_says_so_and_the_call_still_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disk: str, mount: str, state: str) -> None:
    """A host whose cache cannot be written (a real read-only or full filesystem, mounted in a
    mount namespace of the host's own) runs the sources it was sent, every call, and says why."""
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    cache = tmp_path / "cache"
    python = python_with_cache_on(tmp_path, cache, mount)
    t = LocalTransport(replace(LOCALHOST, python=str(python)))
    for _ in range(2):
        result, stream = _call(t)
        assert result["protocol"] == 1 and stream.shipped and (stream.cache, stream.stored) == ("absent", state)
    assert list(cache.iterdir()) == []  # the mounts were the host's own

    # doctor says so, on the host's ssh line, and passes
    host = Host(name="ro-host", address="127.0.0.1", python=str(python), workdir=str(tmp_path))
    ctx = DoctorContext(hosts=(host,), master=host, master_addr="127.0.0.1", master_port=None,
                        workdirs={host.name: str(tmp_path)}, timeout_s=60)
    report = doctor_here(ctx)
    ssh_lines = [f for f in report.findings if f.check == "ssh"]
    assert [f.status for f in ssh_lines] == [CheckStatus.OK, CheckStatus.INFO]
    assert ssh_lines[1].message == ("every call sends the node agent to ro-host: it cannot keep a copy "
                                    f"({state.removeprefix('not written: ')})")


@pytest.mark.skipif(PY38 is None, reason="no python3.8 on this machine")
def test_an_older_python_keeps_a_cache_of_its_own_beside_a_newer_ones(cached_host: LocalTransport,
                                                                      tmp_path: Path) -> None:
    assert _call(cached_host)[1].shipped
    old = LocalTransport(replace(LOCALHOST, python=str(PY38)))
    result, stream = _call(old)
    assert result["python"].startswith("3.8") and stream.shipped and stream.cache == "absent"
    assert not _call(old)[1].shipped and not _call(cached_host)[1].shipped
    names = sorted(p.name for p in (tmp_path / "ddpctl").glob("agent-*.bin"))
    assert len(names) == 2 and any("cpython-38-" in n for n in names)
