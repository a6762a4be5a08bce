"""What Slurm did to a job, judged from `scontrol show job` and Slurm's own lines (recorded from
Slurm 22.05 on the test cluster), and how the Slurm backend tells it: a requeue is followed, a
cancel, a time limit or a failed node is the job's end in Slurm's words, and the ranks that die
of it are never told as failures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from inventory import load_job
from node_agent.runtime.records import rank_phase
from node_agent.wire.protocol import EVENT_PREFIX, RESULT_PREFIX
from node_agent.wire.replies import wire
from orchestrator.launch.backends import slurm as slurm_backend
from orchestrator.launch.backends.slurm import SlurmBackend, Submission
from orchestrator.launch.backends.slurm_events import (
    Kind,
    down_nodes,
    queue_seconds,
    slurm_event_of,
    slurm_said,
)
from orchestrator.launch.events import BackendEvent, Ended, Exited, Milestone, Notice, Reported
from orchestrator.launch.plan import build_plan
from orchestrator.remote.agent import AgentEvent
from orchestrator.remote.slurm_client import parse_key_values, parse_nodes

RUNNING = ("JobId=34 JobName=train UserId=alice(1000) JobState=RUNNING Reason=None Requeue=1 Restarts=0 "
           "ExitCode=0:0 TimeLimit=01:00:00 SubmitTime=2026-11-25T21:45:50 StartTime=2026-11-25T21:45:53 "
           "EndTime=2026-11-25T22:45:53 NodeList=s[1-2]")


def show(**fields: str) -> dict[str, str]:
    return {**parse_key_values(RUNNING), **fields}


STAR = "slurmstepd-s1: error: *** JOB 34 ON s1 CANCELLED AT 2026-11-25T21:46:08{} ***"


@pytest.mark.parametrize(("fields", "lines", "kind", "words"), [
    ({}, [], None, None),  # running: a failure now is the job's own
    ({"JobState": "FAILED"}, [], None, None),  # ended by itself
    ({"JobState": "COMPLETED"}, [], None, None),
    ({"JobState": "COMPLETING", "Restarts": "1"}, [STAR.format(" DUE TO JOB REQUEUE")], Kind.REQUEUED,
     "Slurm requeued job 34 (job requeue): run 0 ended (Slurm: JOB 34 ON s1 CANCELLED AT 2026-11-25T21:46:08 "
     "DUE TO JOB REQUEUE); `up` stays attached and follows run 1"),
    ({"JobState": "PENDING", "Reason": "BeginTime", "Restarts": "1"}, [], Kind.REQUEUED, "(requeue): run 0 ended;"),
    ({"JobState": "COMPLETING"}, [], Kind.ENDING, None),  # scontrol hides why: wait for Slurm's word
    ({"JobState": "COMPLETING"}, [STAR.format("")], Kind.CANCELLED,
     "Slurm job 34 was cancelled at 21:46:08, not by ddpctl (scancel by alice, its owner, or an admin"),
    ({"JobState": "CANCELLED", "EndTime": "2026-11-25T21:50:01"}, [], Kind.CANCELLED, "cancelled at 21:50:01"),
    ({"JobState": "COMPLETING"}, [STAR.format(" DUE TO TIME LIMIT")], Kind.TIMEOUT,
     "Slurm job 34 hit its time limit at 21:46:08: TIMEOUT after 01:00:00"),
    ({"JobState": "TIMEOUT"}, [], Kind.TIMEOUT, "TIMEOUT after 01:00:00"),
    ({"JobState": "NODE_FAIL", "EndTime": "2026-11-25T21:56:08"}, ["srun: error: Node failure on s2"],
     Kind.NODE_FAIL, "Slurm marked node s2 NODE_FAIL at 21:56:08 and ended job 34 (s2: DOWN*: Not responding)"),
    ({"JobState": "PREEMPTED"}, [], Kind.ENDED, "Slurm ended job 34: PREEMPTED"),
    ({"JobState": "STEP_STARTED_BUT_ODD"}, [], None, None),
])
def test_judge_tells_what_slurm_did_in_its_own_words(fields: dict[str, str], lines: list[str], kind: Kind | None,
                                                    words: str | None) -> None:
    said = [s for s in map(slurm_said, lines) if s is not None]
    down = {"s2": "DOWN*: Not responding"} if fields.get("JobState") == "NODE_FAIL" else {}
    event = slurm_event_of("34", show(**fields), 0, said, down)
    assert (event.kind if event else None) is kind
    if words is not None:
        assert event is not None and words in event.text, event.text
    if kind is Kind.NODE_FAIL:
        assert event is not None and event.nodes == ("s2",) and event.ends_job


def test_a_later_run_is_judged_by_its_own_restart_count() -> None:
    assert slurm_event_of("34", show(Restarts="1"), 1, []) is None  # run 1 runs: nothing happened to it
    requeued = slurm_event_of("34", show(Restarts="2", JobState="PENDING"), 1, [])
    assert requeued is not None and requeued.kind is Kind.REQUEUED and not requeued.ends_job


def test_slurm_said_reads_slurmstepd_and_srun_lines_and_nothing_else() -> None:
    step = slurm_said("slurmstepd-s1: error: *** STEP 34.0 ON s1 CANCELLED AT 2026-11-25T21:46:08 ***")
    assert step is not None and not step.job and step.node == "s1" and step.why is None
    job = slurm_said(STAR.format(" DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS"))
    assert job is not None and job.job and job.why == "NODE FAILURE" and job.at == "2026-11-25T21:46:08"
    srun = slurm_said("srun: error: Node failure on s2")
    assert srun is not None and srun.failed_node == "s2"
    assert slurm_said("[default0]:epoch 3 CANCELLED AT noon") is None


def test_down_nodes_keeps_the_ones_slurm_holds_down_with_the_reason_as_written() -> None:
    text = ("NodeName=s1 Arch=x86_64 State=MIXED Partitions=debug\n"
            "NodeName=s2 Arch=x86_64 State=DOWN* Partitions=debug Reason=Not responding [slurm@2026-11-25T21:56:08]\n")
    assert down_nodes(parse_nodes(text)) == {"s2": "DOWN*: Not responding [slurm@2026-11-25T21:56:08]"}


def test_the_queue_time_is_slurms_own_from_the_last_submit_to_the_start() -> None:
    assert queue_seconds(show(SubmitTime="2026-11-25T21:46:12", StartTime="2026-11-25T21:48:13")) == 121.0
    assert queue_seconds(show(StartTime="Unknown")) is None


# -- the backend: Slurm's verdict before a node's end or failure is told ------------------------

def event_line(name: str, **fields: Any) -> str:
    return EVENT_PREFIX + json.dumps({**fields, "event": name})


def result_line(exit_code: int) -> str:
    return RESULT_PREFIX + json.dumps({"exit_code": exit_code, "stop_reason": "supervisor got signal 15"})


RANK_ERROR = event_line("rank", **wire(rank_phase({
    "phase": "error", "local_rank": 0, "rank": 1, "time": 1.0, "type": "DistNetworkError",
    "message": "Connection closed by peer"})))


@dataclass
class FakeClient:
    """Slurm's answers, one per `scontrol show job` (the last one repeats)."""

    answers: list[dict[str, str]]
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    asked: int = 0
    cancelled: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def show_job(self, job_id: str) -> dict[str, str]:
        self.asked += 1
        return self.answers[min(self.asked, len(self.answers)) - 1]

    def show_nodes(self, nodelist: str) -> dict[str, dict[str, str]]:
        return self.nodes

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        self.cancelled.append(job_id)


@dataclass
class Stream:
    lines: list[tuple[str, str]]  # (file, line)

    def messages(self) -> Iterator[AgentEvent]:
        for name, text in self.lines:
            yield AgentEvent("line", {"name": name, "text": text})


def run_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: FakeClient,
                lines: list[tuple[str, str]]) -> tuple[SlurmBackend, list[BackendEvent]]:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.toml").write_text('[job]\nname = "train"\nscript = "train.py"\nnproc_per_node = 1\n'
                                       "[slurm]\nnodes = 2\n")
    job = load_job(tmp_path / "job.toml")
    monkeypatch.setattr(slurm_backend, "slurm_client", lambda *_args: client)
    backend = SlurmBackend(None, job)  # type: ignore[arg-type]
    assert job.slurm is not None
    hosts = slurm_backend.node_hosts(job, job.slurm)
    plan = build_plan(replace(job, hosts=hosts), "train-1", {h.name: 1 for h in hosts}, 29500)
    sub = Submission(plan, "/state", "34", tmp_path / "slurm.json")
    events: list[BackendEvent] = []
    backend.submitted, backend.emit = sub, events.append
    started = [("r0-node0.out", event_line("started", hostname="s1", log="l")),
               ("r0-node1.out", event_line("started", hostname="s2", log="l"))]
    backend._follow(sub, Stream(started + lines), events.append)  # type: ignore[arg-type]
    return backend, events


def told(events: list[BackendEvent]) -> list[str]:
    out = []
    for e in events:
        if isinstance(e, Ended):
            out.append(f"ended {e.host}{' lost' if e.lost else ''}")
        elif isinstance(e, Exited):
            out.append(f"exited {e.host} {e.exit_code}")
        elif isinstance(e, Milestone):
            out.append(f"rank error {e.host}")
        elif isinstance(e, Notice) and "requeue" in e.text:
            out.append(f"requeue {e.host}")
    return out


def test_a_failure_while_the_job_runs_is_the_jobs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, events = run_backend(tmp_path, monkeypatch, FakeClient([show()]),
                            [("r0-node1.out", RANK_ERROR), ("r0-node1.out", result_line(1))])
    assert told(events) == ["rank error node1", "exited node1 1"]
    assert any(isinstance(e, Reported) for e in events)


def test_a_controller_that_does_not_answer_is_asked_again_before_a_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_backend, "SHOW_RETRY_S", 0.0)
    client = FakeClient([{}, {}, show(JobState="COMPLETING", Restarts="1")])
    _, events = run_backend(tmp_path, monkeypatch, client, [("r0-node0.out", result_line(1))])
    assert told(events) == ["requeue node0", "requeue node0"] and client.asked == 3


def test_an_admins_requeue_swallows_the_runs_ends_and_its_victims_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient([show(JobState="COMPLETING", Restarts="1")])
    backend, events = run_backend(tmp_path, monkeypatch, client, [
        ("r0-node1.out", RANK_ERROR), ("r0-node0.out", result_line(1)), ("r0-node1.out", result_line(1))])
    assert told(events) == ["requeue node0", "requeue node0", "requeue node1"]
    assert backend.requeued == {0} and client.asked == 1  # asked once: the run's verdict is kept
    backend.stop(["node0", "node1"], force=False, failed=True)
    assert client.cancelled == []  # never cancel what Slurm is requeueing


def test_an_end_slurm_has_not_explained_waits_for_its_word_then_is_told_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scontrol says COMPLETING (it hides why): the ends wait until slurmstepd's line comes."""
    client = FakeClient([show(JobState="COMPLETING")])
    _, events = run_backend(tmp_path, monkeypatch, client, [
        ("r0-node0.out", result_line(1)), ("r0-node1.out", RANK_ERROR),
        ("batch.out", STAR.format("")), ("r0-node1.out", result_line(1))])
    assert told(events) == ["ended node0", "exited node0 1", "exited node1 1"]
    ended = next(e for e in events if isinstance(e, Ended))
    assert "was cancelled at 21:46:08, not by ddpctl" in ended.cause


def test_a_cancel_by_ddpctl_down_elsewhere_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient([show(JobState="CANCELLED", EndTime="2026-11-25T21:50:01")],
                        files={"/state/cancelled-by": "`ddpctl down` by alice on laptop\n"})
    _, events = run_backend(tmp_path, monkeypatch, client, [("r0-node0.out", result_line(143))])
    ended = next(e for e in events if isinstance(e, Ended))
    assert ended.cause == "Slurm job 34 was cancelled at 21:50:01 by `ddpctl down` by alice on laptop"


def test_a_node_slurm_marks_failed_is_the_lost_one_by_its_slurm_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient([show(JobState="NODE_FAIL")],
                        nodes=parse_nodes("NodeName=s1 State=IDLE\nNodeName=s2 State=DOWN* Reason=Not responding\n"))
    _, events = run_backend(tmp_path, monkeypatch, client, [
        ("r0-node0.out", RANK_ERROR), ("r0-node0.out", result_line(1))])
    assert told(events) == ["ended node1 lost", "exited node0 1"]


def test_our_own_cancel_is_never_told_as_slurms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient([show(), show(JobState="COMPLETING")])
    backend, events = run_backend(tmp_path, monkeypatch, client, [])
    backend.stop(["node0", "node1"], force=False)  # Ctrl-C: no question asked
    assert client.cancelled == ["34"] and client.asked == 0
    names = ["node0", "node1"]
    assert backend.submitted is not None
    backend._node_line(backend.submitted, 0, 0, names, result_line(143), events.append)
    assert told(events) == ["exited node0 143"]

