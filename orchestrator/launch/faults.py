"""The fault model of a running job: what counts as a lost host, after how long, on which side.
Every limit is here; docs/running.md's table ("The fault model") is generated from `fault_table`
(tests/unit/test_faults.py checks that it is)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

HEARTBEAT_EVERY = 2.0  # both ways: the control plane to each node, each node to the control plane
SILENT_AFTER = 8.0  # four heartbeats missed: start reaching the host on a fresh connection
RETRY_EVERY = 2.0  # between two attempts at a fresh connection (each within --connect-timeout)
DEFAULT_LOST_AFTER = 60.0
NODE_FACTOR = 1.5  # the node's own limit, from the control plane's
NODE_WATCH_EVERY = 0.5  # how often a node's watchdog looks (node_agent/runtime/supervisor.py WATCH_EVERY)
SELF_STOP_MARGIN = 2.0  # clocks, scheduling: on top of the node's own bound before we count on it
# A stop asked: on top of --grace, a host's last SIGKILL reaped (node_agent/host/terminate.py
# KILL_WAIT_S, 5 s), its last output and its report sent
STOP_MARGIN = 10.0
MIN_LOST_AFTER = SILENT_AFTER + RETRY_EVERY  # a host must have a chance to be reached again


class LinkState(str, enum.Enum):
    """A host's link to the control plane, entered at a time the supervision records."""

    CONNECTED = "connected"  # lines, heartbeats or events arrive (a reader held up by our own
    # backlog counts as contact: the host is not silent, we are slow)
    SILENT = "silent"  # nothing for `silent_after` s, or the node has not heard us for that long:
    # the job runs on while the backend tries a fresh connection every `retry_every` s
    REATTACHED = "re-attached"  # a fresh connection took over (output resumes at the last
    # committed batch); from then on it counts as CONNECTED
    LOST = "lost"  # silent for `lost_after` s; or at once: its connection closed without an exit
    # status, ranks elsewhere failed with errors pointing at it, or ddpctl's own thread that follows
    # it failed. The job stops on every host. While a stop is under way: not confirmed in `stop_bound`.
    # The node stops its own job after `node_after` = lost_after x NODE_FACTOR s without us: later
    # than we give up, so a re-attach just in time finds the job still running.


@dataclass(frozen=True)
class FaultLimits:
    """The limits of one job's supervision; `lost_after` is the job file's [supervise] lost_after
    (or --lost-after); the rest follow from it or are fixed."""

    lost_after: float = DEFAULT_LOST_AFTER
    heartbeat_every: float = HEARTBEAT_EVERY
    silent_after: float = SILENT_AFTER
    retry_every: float = RETRY_EVERY

    @property
    def node_after(self) -> float:
        """The node's own limit: it ends its job after this long without a heartbeat."""
        return self.lost_after * NODE_FACTOR

    def self_stopped_after(self, grace: float, closed: bool = False) -> float:
        """How long after a host was declared lost its job is surely gone without us. Its
        watchdog fires `node_after` s after the last heartbeat it heard (we send none once it is
        dropped), then its ranks get `grace` s before SIGKILL. `closed`: it was lost because its
        connection closed (host or sshd died): its node ended its job at once then, so only the
        grace is left."""
        return (0.0 if closed else self.node_after) + NODE_WATCH_EVERY + grace + SELF_STOP_MARGIN

    def stop_bound(self, grace: float) -> float:
        """How long after a stop is asked (Ctrl-C, SIGTERM, SIGHUP, a failure, `ddpctl down`) each
        host has to confirm it, whatever its link's state: its ranks' `grace` (0: a forced stop),
        then SIGKILL's wait, its last output and its report. A host that has not by then (its link
        silent or re-attaching, its stop word never delivered) is lost, so that `up` ends: its node
        ends its part on its own, on the stop word or `node_after` without a heartbeat."""
        return grace + STOP_MARGIN


@dataclass
class Link:
    """One host's link as the control plane sees it, with when it entered its state."""

    host: str
    state: LinkState = LinkState.CONNECTED
    since: float = 0.0  # time.time() the state was entered (SILENT: of the last contact)

    def enter(self, state: LinkState, at: float | None = None) -> None:
        self.state, self.since = state, time.time() if at is None else at


def limits_for(job_lost_after: float | None, option_lost_after: float | None) -> FaultLimits:
    """The flag wins over the job file, the job file over the default."""
    chosen = option_lost_after if option_lost_after is not None else job_lost_after
    return FaultLimits(lost_after=DEFAULT_LOST_AFTER if chosen is None else max(chosen, MIN_LOST_AFTER))


def link_state_after(link: Link, quiet_s: float, limits: FaultLimits) -> LinkState | None:
    """The state a host's link moves to after `quiet_s` seconds without contact, or None when it
    stays where it is (a LOST link stays lost)."""
    if link.state is LinkState.LOST:
        return None
    if quiet_s >= limits.lost_after:
        return LinkState.LOST
    if quiet_s >= limits.silent_after and link.state is not LinkState.SILENT:
        return LinkState.SILENT
    if quiet_s < limits.silent_after and link.state is LinkState.SILENT:
        return LinkState.CONNECTED  # heard again on the old connection: the blip is over
    return None


def fault_table(limits: FaultLimits | None = None) -> list[tuple[str, str, str]]:
    """(what happens, after how long, on which side): docs/running.md's table, from the code."""
    lim = limits or FaultLimits()
    return [
        ("heartbeat sent (both ways)", f"every {lim.heartbeat_every:.0f} s", "control plane and node"),
        ("a host is silent: fresh connection tried, job keeps running",
         f"{lim.silent_after:.0f} s without a line, event or heartbeat (or the node has not heard us "
         "for as long)", "control plane"),
        ("another fresh connection tried", f"every {lim.retry_every:.0f} s (each within --connect-timeout)",
         "control plane"),
        ("re-attached: output resumes at the last committed batch, one notice for the episode",
         "as soon as a fresh connection gets through", "control plane"),
        ("the host is lost: the job stops on every host", f"lost_after = {lim.lost_after:.0f} s of silence "
         "([supervise] lost_after, --lost-after)", "control plane"),
        ("the host is lost at once", "its connection closes without an exit status (host or sshd died), "
         "ranks elsewhere fail with errors naming a silent host, or ddpctl's own thread that follows it fails "
         "(reported with its error)", "control plane"),
        ("a stop (Ctrl-C, SIGTERM, SIGHUP, a failure, `ddpctl down`): each host confirms it, or is lost and `up` "
         "ends without it", f"within --grace + {STOP_MARGIN:g} s = {lim.stop_bound(10.0):.0f} s with --grace 10, "
         f"whatever its link's state (a second Ctrl-C: {STOP_MARGIN:g} s from then); its node ends its part on its "
         "own", "control plane"),
        ("the node ends its own job", f"{NODE_FACTOR:g} x lost_after = {lim.node_after:.0f} s without a "
         "heartbeat, whatever its ranks print", "node"),
        ("the node ends its own job at once", "its current control connection closes (`up` killed)", "node"),
        ("fencing: no new attempt while a lost host may still run the old one", "until the host is reached "
         "again on a fresh connection and its job is ended there, or its own bound has passed since it was "
         f"declared lost: {NODE_FACTOR:g} x lost_after + --grace + {NODE_WATCH_EVERY + SELF_STOP_MARGIN:g} s "
         f"= {lim.self_stopped_after(10.0):.0f} s with --grace 10; --grace + "
         f"{NODE_WATCH_EVERY + SELF_STOP_MARGIN:g} s = {lim.self_stopped_after(10.0, closed=True):.1f} s where its "
         "connection closed (its node ended the job at once)", "control plane"),
    ]


def fault_table_markdown(limits: FaultLimits | None = None) -> str:
    rows = ["| what | when | decided by |", "| --- | --- | --- |"]
    rows += [f"| {what} | {when} | {side} |" for what, when, side in fault_table(limits)]
    return "\n".join(rows)
