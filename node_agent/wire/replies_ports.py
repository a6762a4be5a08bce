"""Node agent replies (declared once: node_agent/wire/replies.py): port_owners, kill_port, the facts' sub-facts."""

from __future__ import annotations

from dataclasses import dataclass

from node_agent.wire.replies import one_line, wire

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, List, Optional, Tuple


@dataclass(frozen=True)
class PortOwner:
    pid: int
    user: str
    cmdline: Tuple[str, ...] = ()
    name: str = ""
    age_s: Optional[float] = None
    status: str = ""  # LISTEN, ESTABLISHED, BOUND (udp) ...
    ddpctl_job_id: Optional[str] = None
    is_torchrun: bool = False
    refusal: Optional[str] = None  # why it will not be killed (None: it may be)
    torchrun_agent: Optional[int] = None  # a torchrun worker's agent pid: the kill takes the agent's whole tree
    job_live: bool = False  # its ddpctl job's supervisor on that host still runs it

    @property
    def command(self) -> str:
        return one_line(self.cmdline or [self.name or "?"])

    def describe(self, width: int = 160) -> str:
        job = ", ddpctl job %s" % self.ddpctl_job_id if self.ddpctl_job_id else ""
        return "pid %d (user %s%s): %s" % (self.pid, self.user, job, self.command[:width])


@dataclass(frozen=True)
class KilledProcess:
    pid: int
    cmdline: str  # its command line, cut at 300 characters
    signal: str  # the signal that ended it: SIGTERM, or SIGKILL after the grace period
    owner: bool  # held the port itself (False: part of its process tree)

    @property
    def command(self) -> str:
        return one_line([self.cmdline])


@dataclass(frozen=True)
class RefusedProcess:
    pid: Optional[int]  # None: a socket whose process the agent cannot see
    reason: str


@dataclass(frozen=True)
class UnseenSocket:
    """A socket on the port held by a process the agent's user cannot see (another user's)."""

    status: str
    laddr: str
    user: str


@dataclass(frozen=True)
class PortReport:
    """port_owners' and kill_port's answer."""

    port: int
    proto: str
    owners: Tuple[PortOwner, ...]
    time_wait: int  # TIME_WAIT sockets with no process
    time_wait_max_s: float
    killed: Tuple[KilledProcess, ...] = ()
    refused: Tuple[RefusedProcess, ...] = ()
    errors: Tuple[str, ...] = ()  # signals that could not be sent, processes that survived SIGKILL
    free_after: Optional[bool] = None  # None: nothing was attempted
    unseen: Tuple[UnseenSocket, ...] = ()
    # No process holds the port at the op's end, and it binds as torchrun's store binds (with
    # SO_REUSEADDR: a TIME_WAIT of a socket that set it too is no conflict).
    free: bool = True
    # Where no process holds the port, why that bind still fails: a TIME_WAIT of a socket without
    # SO_REUSEADDR (until its timer ends), or a closing socket. None: it binds, or a process holds it.
    bind_error: Optional[str] = None
    after: Optional[Tuple[PortOwner, ...]] = None  # kill_port: the holders left once it waited
    dry_run: bool = False
    exit_code: int = 0
    host: str = ""

    @property
    def killable(self) -> List[PortOwner]:
        return [o for o in self.owners if o.refusal is None]

    def to_json(self) -> Dict[str, Any]:
        """As the agent sent it (kill-port --json): the host is the key it is listed under."""
        out = wire(self)
        del out["host"]
        return out


@dataclass(frozen=True)
class MasterPortFact:
    """The facts op's look at the master port on the master host."""

    port: int
    bindable: bool = True
    bind_error: Optional[str] = None
    owners: Optional[Tuple[PortOwner, ...]] = None  # None: not looked (bindable), or cannot list owners


@dataclass(frozen=True)
class CheckpointFact:
    """The facts op's look at [restart] checkpoint_dir on one host (node_agent/ops/facts.py)."""

    path: str  # as the host resolved it (workdir-relative, `~` expanded there)
    writable: bool  # it exists or was created, and a file could be written in it
    existed: Optional[bool] = None  # it was there before doctor looked (False: doctor created it)
    step: Optional[str] = None  # where it failed: "mkdir", "write" or "timeout"
    error: Optional[str] = None  # ... with the OS error
    seen: Optional[Tuple[str, ...]] = None  # hosts whose marker file it saw there (None: it did not look)
    list_error: Optional[str] = None  # why it could not list the directory
    cleanup_error: Optional[str] = None  # its marker file could not be removed
    marker: Optional[str] = None  # its marker file, left until the session ends


@dataclass(frozen=True)
class ModuleLookupFact:
    """Whether a host's interpreter finds a module, looked up there without importing it (its
    parent packages are imported): node_agent/ops/torch_facts.py lookup_module."""

    found: bool
    origin: Optional[str] = None  # the module's file where found
    executable: str = ""  # the interpreter that looked (its sys.executable)
    error: Optional[str] = None  # a parent package failed to import (then not found)
