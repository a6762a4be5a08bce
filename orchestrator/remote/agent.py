"""Runs one op of node_agent on a host (its key on the channel's stdin, its sources only where the
host has not cached them: docs/architecture.md, "The agent, sent once"), and decodes its output.

This is the one reader of the agent's stdout in the control plane: `decode` turns each line into
an `AgentEvent`, the op's `AgentResult`, or plain program output; `call_agent` (one round trip)
and `AgentStream` (a long op with a control channel) are built on it."""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import node_agent
from node_agent.wire.protocol import EVENT_PREFIX, RESULT_PREFIX, parse_line
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.programs import shipped_sources
from orchestrator.remote.transport import (
    Chunk,
    CommandResult,
    OutputLine,
    RunningCommand,
    Transport,
    split_text,
    timed_out,
)

# Runs on the host under `python -c`. It is a constant, never built from user data. It reads a line
# "<length> <key>", that many bytes of the agent's sources (node_agent's and the programs doctor runs,
# programs.py; zlib'd JSON: none when the call sends only the key) and the request line. The key
# names the sources and this text. A host runs the code objects it cached for that key (one file
# per key and interpreter build under the user's cache directory, written 0600 and atomically, read
# only when the user owns it and no one else may write it, the trust Python gives __pycache__, and
# when its hash matches its content). A call that sent only the key hears first whether the host
# has it (an `agent` event); if not, the sources follow on stdin, in the same round trip, and a
# second `agent` event says what the host did with them ("written", "not written: <why>": doctor's
# ssh line shows it). Where the cache cannot be written, each module compiles when imported and
# each call sends the sources. A program's modules are never imported here: the supervisor reads
# their sources through this finder (node_agent/runtime/programs.py) and writes them out.
# A plain finder/loader: importlib.abc and importlib.util would cost every call ~7 ms of imports.
BOOTSTRAP = """\
import sys, os, marshal, importlib.machinery as m
b = sys.stdin.buffer
size, key = b.readline().split()
blob = b.read(int(size))
request = b.readline()
tag = sys.implementation.cache_tag
base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ddpctl")
path = os.path.join(base, "agent-%s-%s-%x.bin" % (key.decode(), tag, sys.hexversion))
try:
    from _blake2 import blake2b
except ImportError:
    from hashlib import blake2b
def digest(data):
    return blake2b(data, digest_size=16).hexdigest().encode()
codes, state = None, "absent"
try:
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        head, body = f.readline().split(), f.read()
    if not tag or st.st_uid != os.getuid() or st.st_mode & 0o022:
        state = "not trusted: others may write it"
    elif head != [b"ddpctl-agent", key, digest(body)]:
        state = "damaged: its content does not match its hash"
    else:
        blob, codes = marshal.loads(body)
        state = "cached"
        import time
        if st.st_mtime < time.time() - 86400:  # in use: kept when older keys are pruned
            os.utime(path)
except FileNotFoundError:
    pass
except Exception as e:
    state = "unreadable: %s" % e
if not int(size):
    import json
    sys.stdout.write("@@DDPCTL-EVENT@@ %s\\n" % json.dumps({"event": "agent", "cached": bool(codes), "state": state}))
    sys.stdout.flush()
    if not codes:
        blob = b.read(int(b.readline()))
srcs = {}
def sources():
    if not srcs:
        import json, zlib
        srcs.update(json.loads(zlib.decompress(blob).decode()))
    return srcs
def compiled(n):
    return marshal.dumps(compile(sources()[n][1], "ddpctl-agent/" + n.replace(".", "/") + ".py", "exec"))
if not codes:
    codes = {}
    try:
        if not tag or sys.flags.dont_write_bytecode:
            raise OSError(0, "")
        os.makedirs(base, mode=0o700, exist_ok=True)
        tmp = "%s.%d" % (path, os.getpid())
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                body = marshal.dumps((blob, {n: (p, compiled(n)) for n, (p, s) in sources().items()}))
                f.write(b"ddpctl-agent %s %s\\n" % (key, digest(body)) + body)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        codes = marshal.loads(body)[1]
        state = "written"
        now = os.stat(path).st_mtime
        for old in os.listdir(base):
            try:
                if old.startswith("agent-") and os.stat(os.path.join(base, old)).st_mtime < now - 14 * 86400:
                    os.remove(os.path.join(base, old))
            except OSError:
                pass  # gone meanwhile (another call's prune)
    except OSError as e:
        state = "not written: %s" % e.strerror if e.errno else "not kept: no bytecode here (PYTHONDONTWRITEBYTECODE)"
    if not int(size):
        sys.stdout.write("@@DDPCTL-EVENT@@ %s\\n" % json.dumps({"event": "agent", "state": state}))
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
        exec(marshal.loads(codes[mod.__name__][1] if codes else compiled(mod.__name__)), mod.__dict__)
sys.meta_path.insert(0, F())
import node_agent.__main__ as a
sys.exit(a.main(request))
"""

# Picks the inventory's interpreter when it exists, else python3, so a host whose configured
# interpreter is missing still answers (and doctor can say so). "$1"/"$2" are argv, not code.
# -S: no site start-up (a virtualenv's .pth files cost up to 20 ms a call; node_agent/host/sitedirs.py
# finds site-packages for the two lookups that want them).
LAUNCHER = 'P="$1"; command -v "$P" >/dev/null 2>&1 || P=python3; exec "$P" -S -c "$2"'


@functools.cache
def agent_code() -> tuple[str, bytes]:
    """The agent's key and its sources, compressed (zlib'd JSON of each module's (is a package,
    source)): node_agent's, and the train_jobs programs ddpctl runs on the hosts (programs.py), so
    a host caches those with the agent and a launch of one sends only their names. The key names
    the sources and the BOOTSTRAP that caches them on a host."""
    root = Path(node_agent.__file__).parent
    sources: dict[str, tuple[bool, str]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        package = parts[-1] == "__init__"
        sources[".".join(parts[:-1] if package else parts)] = (package, path.read_text())
    sources.update(shipped_sources())
    blob = zlib.compress(json.dumps(sources).encode(), 6)
    return hashlib.sha256(BOOTSTRAP.encode() + blob).hexdigest()[:32], blob


def agent_payload() -> bytes:
    """The agent whole: a line of its sources' length and key, then the sources. For a request
    read from a file (a Slurm node's), where the host cannot ask for what it lacks."""
    key, blob = agent_code()
    return f"{len(blob)} {key}\n".encode() + blob


def request_bytes(op: str, args: Mapping[str, Any]) -> bytes:
    """A request with the agent's sources in front of it (see agent_payload)."""
    return agent_payload() + json.dumps({"op": op, **args}).encode() + b"\n"


def keyed_request(op: str, args: Mapping[str, Any]) -> bytes:
    """A request behind the agent's key alone: a host that has that agent cached runs it; one
    that lacks it says so, and AgentStream sends the sources (code_bytes) on the same channel."""
    return f"0 {agent_code()[0]}\n".encode() + json.dumps({"op": op, **args}).encode() + b"\n"


def code_bytes() -> bytes:
    """The sources, for a host that asked for them: a line of their length, then them."""
    blob = agent_code()[1]
    return f"{len(blob)}\n".encode() + blob


def agent_argv(python: str) -> list[str]:
    return ["sh", "-c", LAUNCHER, "ddpctl-agent", python, BOOTSTRAP]


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
    started = time.monotonic()
    stream = start_agent(transport, op, args or {})
    stream.close_stdin()  # once the host has its code
    out: list[str] = []
    err: list[str] = []

    def collect() -> None:
        for line in stream.lines():
            (out if line.stream == "stdout" else err).append(line.text)

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    code = stream.wait(timeout)
    if code is None and timeout is not None and time.monotonic() - started >= timeout:
        stream.abort()
        raise timed_out(transport.host.name, stream.argv, timeout)
    reader.join(5)
    return parse_reply(CommandResult(transport.host.name, stream.argv, -1 if code is None else code,
                                     "".join(f"{line}\n" for line in out), "".join(f"{line}\n" for line in err),
                                     time.monotonic() - started))


HELLO = "agent"  # the bootstrap's event on a call that sent only the agent's key
CLOSE = None  # in AgentStream.held: close stdin there


@dataclass
class AgentStream:
    """A long op (supervise, facts with a probe, logs -f): its decoded messages as they arrive,
    and its stdin kept open as the control channel.

    On a call that sent only the agent's key (`greet`), a thread of its own reads the host's first
    lines: its HELLO (whether it has that agent: if not, the sources go now) and, where they went,
    a second (what its cache did with them). Until the first, what the caller sends (or a close of
    stdin) is held, so the sources come first; the caller never has to read for that to happen."""

    host: str
    running: RunningCommand
    argv: tuple[str, ...] = ()
    other: list[str] = field(default_factory=list)  # the last non-protocol lines, for error messages
    held: list[bytes | None] | None = None  # sends (CLOSE: close_stdin) waiting for the HELLO
    shipped: bool = False  # this call sent the agent's sources
    cache: str = ""  # the host's agent cache, as it greeted: "cached", or why not ("absent", ...)
    stored: str = ""  # ... and, where the call sent the sources, what it did with them ("written")
    lock: threading.Lock = field(default_factory=threading.Lock)
    early: list[Chunk] = field(default_factory=list)  # read with the HELLOs, not yet the caller's
    greeter: threading.Thread | None = None
    source: Iterator[Chunk] | None = None

    def greet(self) -> None:
        self.held = []
        self.greeter = threading.Thread(target=self._greet, daemon=True)
        self.greeter.start()

    def _greet(self) -> None:
        source, hellos = self._source(), 1
        try:
            for name, text in source:
                if name == "stdout":
                    kept = []
                    for line in split_text(text):
                        if hellos and line.startswith(PROTOCOL_MARK):
                            message = decode(OutputLine(name, line))
                            hellos -= 1
                            if isinstance(message, AgentEvent) and message.name == HELLO:
                                hellos += self._hello(message)
                                continue
                            hellos = 0  # the op's own line: no (more) HELLO comes
                        kept.append(line)
                    text = "".join(f"{line}\n" for line in kept)
                if text:
                    self.early.append((name, text))
                if not hellos:
                    return
        finally:
            with self.lock:
                self.held = None  # ended before its HELLO: nothing to send to

    def _hello(self, message: AgentEvent) -> int:
        """Act on a HELLO; how many more come."""
        if self.held is None:  # the second: what the host did with the sources
            self.stored = str(message.get("state") or "")
            return 0
        self.cache = str(message.get("state") or "")
        with self.lock:
            if not message.get("cached"):
                self.running.send(code_bytes())
                self.shipped = True
            held, self.held = self.held, None
            for data in held:
                if data is CLOSE:
                    self.running.close_stdin()
                else:
                    self.running.send(data)
        return 1 if self.shipped else 0

    def _source(self) -> Iterator[Chunk]:
        if self.source is None:
            self.source = self.running.chunks()
        return self.source

    def chunks(self) -> Iterator[Chunk]:
        """The command's output, chunk by chunk as it comes, less the HELLOs."""
        if self.greeter is not None:
            self.greeter.join()
        while self.early:
            yield self.early.pop(0)
        yield from self._source()

    def lines(self) -> Iterator[OutputLine]:
        for name, text in self.chunks():
            for line in split_text(text):
                yield OutputLine(name, line)

    def messages(self) -> Iterator[Message]:
        for line in self.lines():
            message = decode(line)
            if isinstance(message, OutputLine):
                self.other = [*self.other[-19:], message.text]
            yield message

    def batches(self) -> Iterator[list[Batched]]:
        """The messages chunk by chunk, as they arrive (program output on stdout as bare text)."""
        for name, text in self.chunks():
            batch = decode_chunk(name, text)
            if name != "stdout":
                self.other = [*self.other, *(m.text for m in batch if isinstance(m, OutputLine))][-20:]
            yield batch

    def send(self, data: bytes) -> None:
        with self.lock:
            if self.held is not None:
                self.held.append(data)
                return
        self.running.send(data)

    def close_stdin(self) -> None:
        with self.lock:
            if self.held is not None:
                self.held.append(CLOSE)
                return
        self.running.close_stdin()

    def wait(self, timeout: float | None = None) -> int | None:
        return self.running.wait(timeout)

    def abort(self) -> None:
        self.running.abort()


def start_agent(transport: Transport, op: str, args: Mapping[str, Any]) -> AgentStream:
    """Start a long op; stdin stays open as its control channel. It sends the agent's key, not its
    sources: the host asks for them if it lacks them."""
    argv = agent_argv(transport.host.python)
    stream = AgentStream(transport.host.name, transport.start(argv, stdin=keyed_request(op, args)), tuple(argv))
    stream.greet()
    return stream
