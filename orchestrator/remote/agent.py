"""Ships node_agent to a host over the channel's stdin, runs one op there, and decodes its output.

This is the one reader of the agent's stdout in the control plane: `decode` turns each line into
an `AgentEvent`, the op's `AgentResult`, or plain program output; `call_agent` (one round trip)
and `AgentStream` (a long op with a control channel) are built on it."""

from __future__ import annotations

import functools
import hashlib
import json
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import node_agent
from node_agent.protocol import EVENT_PREFIX, RESULT_PREFIX, parse_line
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.transport import CommandResult, OutputLine, RunningCommand, Transport, split_text

# Runs on the host under `python -c`. It is a constant, never built from user data: it reads a
# line "<length> <key>" and the zlib'd JSON of node_agent's sources from stdin, imports them from
# memory, then hands the rest of stdin (request line, control channel) to node_agent.__main__.
# Compiling them costs each call ~5-7 ms of CPU on the host (doctor: on every host at once), so
# the code objects are cached where the torch facts are (each module's marshalled apart, loaded
# only when imported), in one file per key (sources and this text) and interpreter build, written
# 0600 by the user, read only when the user owns it and no one else may write it (the trust Python
# gives __pycache__); where it cannot be written, each module compiles when imported. A plain
# finder/loader: importlib.abc and importlib.util would cost every call ~7 ms of imports.
BOOTSTRAP = """\
import sys, os, json, zlib, marshal, importlib.machinery as m
b = sys.stdin.buffer
size, key = b.readline().split()
blob = b.read(int(size))
srcs = {}
def sources():
    if not srcs:
        srcs.update(json.loads(zlib.decompress(blob).decode()))
    return srcs
tag = sys.implementation.cache_tag
base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ddpctl")
build = "-%s-%x.bin" % (tag, sys.hexversion)
mine = "agent-" + key.decode() + build
codes = None
try:
    st = os.stat(os.path.join(base, mine))
    if tag and st.st_uid == os.getuid() and not st.st_mode & 0o022:
        with open(os.path.join(base, mine), "rb") as f:
            codes = marshal.load(f)
        if not all(type(v) is tuple and len(v) == 2 and type(v[1]) is bytes for v in codes.values()):
            codes = None
except Exception:
    codes = None
def compiled(n):
    return compile(sources()[n][1], "ddpctl-agent/" + n.replace(".", "/") + ".py", "exec")
if not isinstance(codes, dict):
    codes = {}
    if tag and not sys.flags.dont_write_bytecode:
        try:
            os.makedirs(base, mode=0o700, exist_ok=True)
            tmp = os.path.join(base, "%s.%d" % (mine, os.getpid()))
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                marshal.dump({n: (p, marshal.dumps(compiled(n))) for n, (p, s) in sources().items()}, f)
            os.replace(tmp, os.path.join(base, mine))
            for old in os.listdir(base):
                if old.startswith("agent-") and old.endswith(build) and old != mine:
                    os.remove(os.path.join(base, old))
        except OSError:
            pass
names = codes or sources()
class F:
    def find_spec(self, name, path=None, target=None):
        if name in names:
            return m.ModuleSpec(name, self, is_package=names[name][0])
    def create_module(self, spec):
        return None
    def get_source(self, name):
        return sources()[name][1]
    def exec_module(self, mod):
        if names[mod.__name__][0]:
            mod.__path__ = []
        exec(marshal.loads(codes[mod.__name__][1]) if codes else compiled(mod.__name__), mod.__dict__)
sys.meta_path.insert(0, F())
import node_agent.__main__ as a
sys.exit(a.main())
"""

# Picks the inventory's interpreter when it exists, else python3, so a host whose configured
# interpreter is missing still answers (and doctor can say so). "$1"/"$2" are argv, not code.
# -S: no site start-up (a virtualenv's .pth files cost up to 20 ms a call; node_agent/sitedirs.py
# finds site-packages for the two lookups that want them).
LAUNCHER = 'P="$1"; command -v "$P" >/dev/null 2>&1 || P=python3; exec "$P" -S -c "$2"'


@functools.cache
def agent_payload() -> bytes:
    """The compressed sources of the node_agent package, after a line of their length and key."""
    root = Path(node_agent.__file__).parent
    sources: dict[str, tuple[bool, str]] = {}
    for path in sorted(root.glob("*.py")):
        name = "node_agent" if path.stem == "__init__" else f"node_agent.{path.stem}"
        sources[name] = (path.stem == "__init__", path.read_text())
    blob = zlib.compress(json.dumps(sources).encode(), 6)
    # Names the host's compiled copy: the sources and the BOOTSTRAP that writes and reads it.
    key = hashlib.sha256(BOOTSTRAP.encode() + blob).hexdigest()[:20]
    return f"{len(blob)} {key}\n".encode() + blob


def agent_argv(python: str) -> list[str]:
    return ["sh", "-c", LAUNCHER, "ddpctl-agent", python, BOOTSTRAP]


def request_bytes(op: str, args: Mapping[str, Any]) -> bytes:
    return agent_payload() + json.dumps({"op": op, **args}).encode() + b"\n"


@dataclass(frozen=True)
class AgentEvent:
    """One event line of an op (`started`, `heartbeat`, `listening`, `facts`, ...)."""

    name: str
    fields: Mapping[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


@dataclass(frozen=True)
class AgentResult:
    """The op's one result line."""

    data: Mapping[str, Any]

    @property
    def error(self) -> Mapping[str, Any] | None:
        err = self.data.get("error")
        return err if isinstance(err, Mapping) else None

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


Message = AgentEvent | AgentResult | OutputLine
# In a batch, a run of program output lines on stdout is a plain list of their texts: a chatty
# job's output stays one str per line, with no object around it.
Batched = list[str] | str | AgentEvent | AgentResult | OutputLine
PROTOCOL_MARK = "@@DDPCTL-"  # every protocol line starts so (EVENT_PREFIX and RESULT_PREFIX)
assert EVENT_PREFIX.startswith(PROTOCOL_MARK) and RESULT_PREFIX.startswith(PROTOCOL_MARK)


def decode_chunk(name: str, text: str) -> list[Batched]:
    """A chunk of one stream's whole lines: on stdout, each run of program output as one list of
    lines and each protocol line decoded (found with str.find, not a Python step per line);
    another stream's lines (stderr) as OutputLines."""
    if name != "stdout":
        return [OutputLine(name, line) for line in split_text(text)]
    out: list[Batched] = []
    start = pos = 0
    while (at := text.find(PROTOCOL_MARK, pos)) >= 0:
        end = text.find("\n", at)
        if at and text[at - 1] != "\n":  # inside a line of output: not ours
            pos = end + 1
            continue
        if at > start:
            out.append(split_text(text[start:at]))
        out.append(_protocol(text[at:end].rstrip("\r")))
        start = pos = end + 1
    if start < len(text):
        out.append(split_text(text[start:]))
    return out


def _protocol(text: str) -> Batched:
    message = decode(OutputLine("stdout", text))
    return message.text if isinstance(message, OutputLine) else message


def decode(line: OutputLine) -> Message:
    """An agent event, the op's result, or (anything else, stderr included) program output."""
    if line.stream != "stdout":
        return line
    try:
        data = parse_line(line.text)
    except ValueError:
        return line
    if data is None:
        return line
    if data["event"] == "result":
        return AgentResult(data["result"])
    return AgentEvent(str(data["event"]), data)


def agent_failed(host: str, error: Mapping[str, Any]) -> HostError:
    return HostError(host, HostErrorKind.AGENT,
                     f"the node agent failed: {error.get('type')}: {error.get('message')}",
                     "this is a ddpctl bug; the agent traceback is in --json output")


def no_result(host: str, detail: str) -> HostError:
    return HostError(host, HostErrorKind.AGENT, f"the node agent gave no result: {detail or '(no output)'}",
                     "check that python3 (>= 3.8) runs on the host in a non-interactive shell")


@dataclass(frozen=True)
class AgentReply:
    host: str
    result: Mapping[str, Any]
    events: list[AgentEvent]
    output: list[str]  # lines that were not protocol lines
    command: CommandResult


def parse_reply(command: CommandResult) -> AgentReply:
    """The decoded reply of a finished op; no result or an error result is the host's HostError."""
    result: AgentResult | None = None
    events: list[AgentEvent] = []
    output: list[str] = []
    for text in command.stdout.splitlines():
        message = decode(OutputLine("stdout", text))
        if isinstance(message, AgentResult):
            result = message
        elif isinstance(message, AgentEvent):
            events.append(message)
        else:
            output.append(message.text)
    if result is None:
        raise no_result(command.host, f"(exit {command.exit_code}) {command.tail(5)}")
    if result.error is not None:
        raise agent_failed(command.host, result.error)
    return AgentReply(command.host, result.data, events, output, command)


def call_agent(transport: Transport, op: str, args: Mapping[str, Any] | None = None,
               *, timeout: float | None = 60.0) -> AgentReply:
    """Run one op on the transport's host in one round trip and return its parsed reply."""
    command = transport.run(agent_argv(transport.host.python), stdin=request_bytes(op, args or {}),
                            timeout=timeout)
    return parse_reply(command)


@dataclass
class AgentStream:
    """A long op (supervise, facts with a probe, logs -f): its decoded messages as they arrive,
    and its stdin kept open as the control channel."""

    host: str
    running: RunningCommand
    other: list[str] = field(default_factory=list)  # the last non-protocol lines, for error messages

    def messages(self) -> Iterator[Message]:
        for line in self.running.lines():
            message = decode(line)
            if isinstance(message, OutputLine):
                self.other = [*self.other[-19:], message.text]
            yield message

    def batches(self) -> Iterator[list[Batched]]:
        """The messages chunk by chunk, as they arrive (program output on stdout as bare text)."""
        for name, text in self.running.chunks():
            batch = decode_chunk(name, text)
            if name != "stdout":
                self.other = [*self.other, *(m.text for m in batch if isinstance(m, OutputLine))][-20:]
            yield batch

    def send(self, data: bytes) -> None:
        self.running.send(data)

    def close_stdin(self) -> None:
        self.running.close_stdin()

    def wait(self, timeout: float | None = None) -> int | None:
        return self.running.wait(timeout)

    def abort(self) -> None:
        self.running.abort()


def start_agent(transport: Transport, op: str, args: Mapping[str, Any]) -> AgentStream:
    """Start a long op; stdin stays open as its control channel."""
    running = transport.start(agent_argv(transport.host.python), stdin=request_bytes(op, args))
    return AgentStream(transport.host.name, running)
