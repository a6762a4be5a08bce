"""No attempt beside a lost one (orchestrator/restarts/fence.py, node_agent/runtime/attempt_mark.py): a lost
host is reached again and its part ended, or waited out until its own bound; every host an attempt
lost is charged; a stale attempt can tell it no longer owns checkpoint_dir; a shrunk run says so."""

from __future__ import annotations

import os
import time
from pathlib import Path

import node_agent.runtime.checkpoints as checkpoints
import node_agent.runtime.supervisor as supervisor
from inventory import Host
from node_agent.runtime.attempt_mark import claim, owns, read_mark
from node_agent.wire.layout import ATTEMPT_MARK
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.launch.backends.base import Fenced
from orchestrator.launch.faults import NODE_FACTOR, NODE_WATCH_EVERY, FaultLimits, fault_table
from orchestrator.launch.result import HostLoss, HostRun, RunResult, RunState
from orchestrator.restarts.fence import Suspect, fence
from orchestrator.restarts.loop import AttemptRecord, Failure, RestartedRun, classify, lost_hosts
from tests.unit.test_restart_policy import make_job

N0, N1 = Host("node0", "198.18.0.1"), Host("node1", "198.18.0.2")


class Dialled:
    """A backend whose hosts answer after `unreachable` failed dials each (None: never)."""

    def __init__(self, unreachable: dict[str, int | None], ended: int = 2, left: tuple[int, ...] = ()) -> None:
        self.unreachable = unreachable
        self.ended, self.left = ended, left
        self.calls: list[tuple[str, str, float]] = []

    def fence(self, host: Host, job_id: str, grace: float) -> Fenced:
        self.calls.append((host.name, job_id, grace))
        fails = self.unreachable.get(host.name)
        dials = sum(1 for name, _, _ in self.calls if name == host.name)
        if fails is None or dials <= fails:
            raise HostError(host.name, HostErrorKind.UNREACHABLE, "timed out")
        left, self.left = self.left, ()  # pids outlive SIGKILL once, at most
        return Fenced(host.name, self.ended, left)


def settle(backend: Dialled, suspects: list[Suspect]) -> tuple[list[str], list[object]]:
    said: list[str] = []
    settled = fence(suspects, backend, 3.0, said.append, "attempt 1", retry_every=0.05)  # type: ignore[arg-type]
    return said, list(settled)


def test_a_lost_host_reached_again_has_its_part_ended_before_the_next_attempt() -> None:
    backend = Dialled({"node0": 2})
    said, settled = settle(backend, [Suspect(N0, "run.0", time.time() + 60)])
    assert [c[:2] for c in backend.calls] == [("node0", "run.0")] * 3  # dialled until it answered
    assert backend.calls[0][2] == 3.0  # with the job's grace
    assert said[0].startswith("fencing node0 before attempt 1: reaching it again") and "up to 60 s" in said[0]
    assert said[-1] == "node0 reached again: ended 2 process(es) of run.0 still running there"
    assert settled[0].fenced == Fenced("node0", 2)  # type: ignore[attr-defined]


def test_a_host_never_reached_is_waited_out_until_its_own_bound() -> None:
    backend = Dialled({"node0": None})
    safe_at = time.time() + 0.4
    said, settled = settle(backend, [Suspect(N0, "run.0", safe_at)])
    assert time.time() >= safe_at  # not a moment before
    assert settled[0].fenced is None  # type: ignore[attr-defined]
    assert said[-1].startswith("node0 not reached again; its own limit has passed") and "run.0" in said[-1]
    assert len(backend.calls) >= 2  # dialled all along


def test_pids_that_outlive_sigkill_are_not_fenced_and_the_host_is_tried_again() -> None:
    backend = Dialled({"node0": 0}, ended=1, left=(4242,))
    said, settled = settle(backend, [Suspect(N0, "run.0", time.time() + 30)])
    assert any("pids 4242 of run.0 outlived SIGKILL" in line for line in said)
    assert settled[0].fenced == Fenced("node0", 1)  # type: ignore[attr-defined]


def test_several_lost_hosts_are_settled_each_on_its_own() -> None:
    backend = Dialled({"node0": 0, "node1": None}, ended=0)
    said, settled = settle(backend, [Suspect(N0, "run.0", time.time() + 30), Suspect(N1, "run.0", time.time() + 0.3)])
    assert said[0].startswith("fencing node0, node1 before attempt 1")
    assert "node0 reached again: nothing of run.0 runs there" in said
    assert {s.host: s.fenced is None for s in settled} == {"node0": False, "node1": True}  # type: ignore[attr-defined]


def test_no_lost_host_no_fencing() -> None:
    said, settled = settle(Dialled({}), [])
    assert said == [] and settled == []


def test_the_self_stop_bound_covers_the_nodes_watchdog_and_the_grace() -> None:
    limits = FaultLimits(lost_after=10.0)
    assert limits.self_stopped_after(3.0) >= 10.0 * NODE_FACTOR + NODE_WATCH_EVERY + 3.0
    closed = limits.self_stopped_after(3.0, closed=True)  # its node ended the job when the connection closed
    assert 3.0 + NODE_WATCH_EVERY <= closed < limits.self_stopped_after(3.0) - limits.node_after + 0.01
    assert NODE_WATCH_EVERY == supervisor.WATCH_EVERY  # the node's watchdog, as the control plane counts it
    assert any(what.startswith("fencing") for what, _, _ in fault_table(limits))


# -- every lost host charged ------------------------------------------------------------------------


def two_lost() -> RunResult:
    runs = [HostRun("a", 0, "torchrun", RunState.STOPPED, 1),
            HostRun("b", 1, "torchrun", RunState.LOST, ended_at=1_700_000_000.0, error="connection closed"),
            HostRun("c", 2, "torchrun", RunState.LOST, ended_at=1_700_000_000.04, error="connection closed")]
    return RunResult(job_id="train-1.0", run_dir=Path("runs/x"), hosts=runs, exit_code=1, first_failure=runs[1],
                     loss=HostLoss("b", "connection closed", 1_700_000_000.0))


def test_every_host_lost_in_one_attempt_is_charged() -> None:
    verdict = classify(two_lost(), make_job(), 0, [])
    assert verdict.kind is Failure.HOST_FAULT
    assert verdict.hosts == ("b", "c")
    assert set(verdict.faults) == {"b", "c"} and verdict.faults["c"].startswith("c lost at ")
    assert "also lost: c" in verdict.reason


def test_lost_hosts_lists_them_first_lost_first() -> None:
    assert list(lost_hosts(two_lost())) == ["b", "c"]


def test_a_run_that_ended_on_fewer_hosts_says_so(tmp_path: Path) -> None:
    run = RestartedRun("r", tmp_path, 2, size=4)
    run.attempts = [AttemptRecord(0, "r.0", ["a", "b", "c", "d"], tmp_path, 0.0),
                    AttemptRecord(1, "r.1", ["c", "d"], tmp_path, 1.0)]
    assert run.shrunk == "on 2 of 4 hosts: c, d"
    run.attempts[-1].hosts = ["c", "d", "e", "f"]
    assert run.shrunk is None


# -- the attempt mark in checkpoint_dir -------------------------------------------------------------


def test_the_newest_attempt_owns_the_checkpoint_dir(tmp_path: Path) -> None:
    where = str(tmp_path / "ckpt dir; $(x)")
    assert owns(where, "run-1", 0)  # no mark yet: anyone may write
    assert claim(where, "run-1", 0) and owns(where, "run-1", 0)
    assert claim(where, "run-1", 1)
    assert not owns(where, "run-1", 0) and owns(where, "run-1", 1)  # attempt 0, still running, is stale
    assert claim(where, "run-1", 0)  # a late node of attempt 0 never moves it back
    assert read_mark(where) is not None and read_mark(where)["attempt"] == 1  # type: ignore[index]
    assert claim(where, "run-2", 0)  # a new run takes the directory over
    assert not owns(where, "run-1", 1) and owns(where, "run-2", 0)
    assert [p.name for p in Path(where).iterdir()] == [ATTEMPT_MARK]  # no temporary file left


def test_a_checkpoint_dir_that_cannot_be_written_is_not_claimed(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")  # a path through a file: no directory can be made there
    assert not claim(str(tmp_path / "a-file" / "ckpt"), "run-1", 0)
    assert list(tmp_path.iterdir()) == [tmp_path / "a-file"]


def test_the_mark_is_not_progress(tmp_path: Path) -> None:
    (tmp_path / "ckpt.pt").write_text("x")
    old = time.time() - 100
    os.utime(tmp_path / "ckpt.pt", (old, old))  # the checkpoint is older than the mark about to be written
    before = checkpoints.newest_mtime(str(tmp_path))
    claim(str(tmp_path), "run-1", 1)
    assert checkpoints.newest_mtime(str(tmp_path)) == before
