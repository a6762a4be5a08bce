"""Ships node_agent to a host over the channel's stdin and runs one op there."""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import node_agent
from node_agent.protocol import parse_line
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.transport import CommandResult, RunningCommand, Transport

# Runs on the host under `python -c`. It is a constant, never built from user data: it reads a
# length line and the zlib'd JSON of node_agent's sources from stdin, imports them from memory,
# then hands the rest of stdin (request line, control channel) to node_agent.__main__.
BOOTSTRAP = """\
import sys, json, zlib, importlib.abc, importlib.util
b = sys.stdin.buffer
srcs = json.loads(zlib.decompress(b.read(int(b.readline()))).decode())
class F(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in srcs:
            return importlib.util.spec_from_loader(name, self, is_package=srcs[name][0])
    def create_module(self, spec):
        return None
    def exec_module(self, m):
        pkg, src = srcs[m.__name__]
        if pkg:
            m.__path__ = []
        exec(compile(src, "ddpctl-agent/" + m.__name__.replace(".", "/") + ".py", "exec"), m.__dict__)
sys.meta_path.insert(0, F())
import node_agent.__main__ as a
sys.exit(a.main())
"""

# Picks the inventory's interpreter when it exists, else python3, so a host whose configured
# interpreter is missing still answers (and doctor can say so). "$1"/"$2" are argv, not code.
LAUNCHER = 'P="$1"; command -v "$P" >/dev/null 2>&1 || P=python3; exec "$P" -c "$2"'


@functools.cache
def agent_payload() -> bytes:
    """The length-prefixed, compressed sources of the node_agent package."""
    root = Path(node_agent.__file__).parent
    sources: dict[str, tuple[bool, str]] = {}
    for path in sorted(root.glob("*.py")):
        name = "node_agent" if path.stem == "__init__" else f"node_agent.{path.stem}"
        sources[name] = (path.stem == "__init__", path.read_text())
    blob = zlib.compress(json.dumps(sources).encode(), 6)
    return str(len(blob)).encode() + b"\n" + blob


def agent_argv(python: str) -> list[str]:
    return ["sh", "-c", LAUNCHER, "ddpctl-agent", python, BOOTSTRAP]


def request_bytes(op: str, args: Mapping[str, Any]) -> bytes:
    return agent_payload() + json.dumps({"op": op, **args}).encode() + b"\n"


@dataclass(frozen=True)
class AgentReply:
    host: str
    result: dict[str, Any]
    events: list[dict[str, Any]]
    output: list[str]  # lines that were not protocol lines
    command: CommandResult


def parse_reply(command: CommandResult) -> AgentReply:
    result: dict[str, Any] | None = None
    events: list[dict[str, Any]] = []
    output: list[str] = []
    for line in command.stdout.splitlines():
        try:
            data = parse_line(line)
        except ValueError:
            data = None
        if data is None:
            output.append(line)
        elif data["event"] == "result":
            result = data["result"]
        else:
            events.append(data)
    if result is None:
        raise HostError(command.host, HostErrorKind.AGENT,
                        f"the node agent gave no result (exit {command.exit_code}): "
                        f"{command.tail(5) or '(no output)'}",
                        "check that python3 (>= 3.8) runs on the host in a non-interactive shell")
    if "error" in result:
        err = result["error"]
        raise HostError(command.host, HostErrorKind.AGENT,
                        f"the node agent failed: {err.get('type')}: {err.get('message')}",
                        "this is a ddpctl bug; the agent traceback is in --json output")
    return AgentReply(command.host, result, events, output, command)


def call_agent(transport: Transport, op: str, args: Mapping[str, Any] | None = None,
               *, timeout: float | None = 60.0) -> AgentReply:
    """Run one op on the transport's host in one round trip and return its parsed reply."""
    command = transport.run(agent_argv(transport.host.python), stdin=request_bytes(op, args or {}),
                            timeout=timeout)
    return parse_reply(command)


def start_agent(transport: Transport, op: str, args: Mapping[str, Any]) -> RunningCommand:
    """Start a long op (supervise, listen); stdin stays open as its control channel."""
    return transport.start(agent_argv(transport.host.python), stdin=request_bytes(op, args))
