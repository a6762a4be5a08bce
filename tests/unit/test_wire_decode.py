"""The one decoder of the node agent's replies: each reply dataclass (node_agent/wire/replies.py), built
as the agent builds it and serialised as the agent sends it, decodes to an equal object; a reply
that does not fit its class is the host's HostError."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from node_agent.ops import facts
from node_agent.runtime.records import rank_phase
from node_agent.wire import replies_jobs, replies_ports, replies_run, replies_top
from node_agent.wire.replies import wire
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.wire import Facts, decode, decode_log_event, parse_facts, parse_settled, parse_supervise


class r:
    locals().update({k: v for m in (replies_jobs, replies_ports, replies_run, replies_top) for k, v in vars(m).items()
                     if isinstance(v, type)})

OWNER = r.PortOwner(5, "alice", ("python", "-c", "a\n b"), "python", 3.0, "LISTEN", "j1", False, None, 4, True)
ERROR = r.RankError(1, "boom", "tb", 2.5, "/f", rank=3, kind="RuntimeError", step=7, exit_code=None)
GPU = r.GpuStat(0, "GPU-1", "H100", 99.0, 100.0, 80000.0, 300.5)
REPLIES: list[Any] = [
    r.PortReport(29500, "tcp", (OWNER,), 2, 40.5, (r.KilledProcess(5, "python -c a", "SIGKILL", True),),
                 (r.RefusedProcess(None, "unseen"),), ("pid 6: EPERM",), False,
                 (r.UnseenSocket("LISTEN", "[::]:1", "b"),), False, "[Errno 98] Address already in use", (OWNER,),
                 False, 1),
    r.MasterPortFact(29500, False, "in use", (OWNER,)),
    r.CheckpointFact("/ck", True, False, None, None, ("a", "b"), None, None),
    r.ModuleLookupFact(True, "/x/cli.py", "/usr/bin/python3", None),
    r.RankPhase(0, 3, "step", 9.0, None, 12, r.StepWindow(4, 0.5, 100.0, 120.0, 3.0, None, 90.0, 4), 100),
    r.RankPhase(1, None, "error", 9.5, ERROR, 7),
    r.SuperviseResult(1, "rank 3 failed", ERROR, r.NcclChoice(("f",), ("Socket",), ("eth0",), (), ("P2P",)), None,
                      "/log", (ERROR, r.RankError("1", "m", "", None, None)), 7, True, "/state"),
    r.DetachedStart(42, "/s", "/l"),
    r.RunningJobs((r.RunningJob("j-1", None, 0, 9, (9, 10), 2.0, True, None, 512),)),
    r.StoppedJobs((r.StoppedJob("j-1", (9, 10), (10,), {9: "torchrun"}, ()),)),
    r.LogsFound(True, "j-1", 0, False, "/log"),
    r.LogEvent("a\nb", ((2, 1.5),), ((1, None), (1, "3"))),
    r.HostTop("h", 1.0, (GPU, r.GpuStat(None, None, None, None, None, None, None, "lost", "0000:01")), None, True,
              "/proc", (r.TopNode("j", None, 0, True, "running", None, 2, 2,
                                  (r.RankSteps(0, 0, 5, None, 1.0, 2.5, 10.0, 11.0, False),), 0.5, "eth0", "route",
                                  1.0, 2.0, 150.0, 1 << 30, 3, ("0",)),)),
    r.HostSample(150.0, 1 << 30, (GPU,), None, ("GPU-1",), 3),
]


@pytest.mark.parametrize("reply", REPLIES, ids=lambda x: type(x).__name__)
def test_each_reply_decodes_to_what_the_agent_built(reply: Any) -> None:
    sent = json.loads(json.dumps(wire(reply), sort_keys=True, default=str))  # as protocol.emit_result
    assert decode(type(reply), sent, "h") == reply


def test_the_control_plane_fills_its_own_fields() -> None:
    got = decode(r.DetachedStart, wire(r.DetachedStart(1, None, None)), "n0", fill={"host": "n0"})
    assert got.host == "n0" and got.pid == 1


def test_a_rank_record_becomes_its_event() -> None:
    record = {"phase": "error", "time": 3.0, "local_rank": 1, "rank": -1, "pid": 9, "type": "ValueError",
              "message": "bad", "traceback": "tb", "step": 2, "window": {"steps": 0}}
    phase = decode(r.RankPhase, json.loads(json.dumps(wire(rank_phase(record)))), "h")
    assert phase.rank is None and phase.window is None and phase.error is not None
    assert (phase.error.summary, phase.error.step, phase.error.timestamp) == ("ValueError: bad", 2, 3.0)


@pytest.mark.parametrize(("cls", "data", "where"), [
    (r.RunningJobs, {"jobs": [{"job_id": 3}]}, "RunningJobs.jobs[0].job_id is 3, not str"),
    (r.StoppedJobs, {"stopped": "x"}, "StoppedJobs.stopped is str, not a list"),
    (r.HostSample, {"cpu_percent": "lots", "rss_bytes": None}, "HostSample.cpu_percent is 'lots'"),
    (r.LogsFound, {"found": True}, "LogsFound.job_id is missing"),
    (r.LogEvent, {"text": "a", "times": [[1, 2.0, 3]], "labels": []}, "has 3 items, not 2"),
    (r.StoppedJobs, [], "StoppedJobs is list, not an object"),
    (r.StoppedJobs, {"stopped": [{"job_id": "j", "terminated": [], "killed": [], "left": [],
                                  "commands": {"x": "y"}}]}, "key is 'x', not int"),
])
def test_a_malformed_reply_is_the_hosts_protocol_error(cls: type, data: Any, where: str) -> None:
    with pytest.raises(HostError, match="malformed") as caught:
        decode(cls, data, "n0")
    assert caught.value.kind is HostErrorKind.PROTOCOL and caught.value.host == "n0" and where in str(caught.value)


def test_a_crashed_supervisor_and_a_bad_log_event() -> None:
    crashed = parse_supervise({"error": {"type": "OSError", "message": "no", "traceback": "tb"}, "exit_code": 70})
    assert (crashed.exit_code, crashed.error) == (70, "no")
    with pytest.raises(HostError, match="malformed log event: 2 lines, 1 times"):
        decode_log_event("n0", {"text": "a\nb", "times": [[1, 1.0]], "labels": [[1, None]]})


# -- the facts op: typed sub-facts, each one decoded on its own ------------------------------------

def test_the_facts_declaration_has_every_sub_fact_the_agent_can_send() -> None:
    sent = set(facts.registry()) | {"hostname", "elapsed_s", "time"}  # collect() always adds those
    assert {f.name for f in dataclasses.fields(Facts)} == sent


def test_a_malformed_sub_fact_is_its_own_error_and_the_others_stand() -> None:
    hf = parse_facts("n0", {"facts": {"hostname": "gpu-1", "cpu_count": "many", "gpu_count": 2,
                                      "resolution": {"master": [{"family": "inet", "address": "10.0.0.1"}],
                                                     "routes": {"10.0.0.1": {"error": "unreachable"}}}},
                            "errors": {"torch": "TimeoutExpired: 90s"}}, 1.0, 2.0)
    assert hf.facts.cpu_count is None and hf.cpu_count == 1 and hf.gpu_count == 2 and hf.hostname == "gpu-1"
    assert "malformed cpu_count fact: cpu_count is 'many', not int" in hf.errors["cpu_count"]
    assert hf.errors["torch"] == "TimeoutExpired: 90s" and (hf.sent_at, hf.received_at) == (1.0, 2.0)
    assert hf.resolution.master[0].address == "10.0.0.1" and hf.resolution.routes["10.0.0.1"].error == "unreachable"
    assert hf.route_source is None and parse_facts("n0", {}).resolution.routes == {}


def test_a_sub_fact_sent_as_none_was_run_one_not_sent_was_not() -> None:
    no_smi = parse_facts("n0", {"facts": {"gpus": None}})
    assert no_smi.facts.gpus is None and no_smi.ran("gpus") and not no_smi.ran("hostname_resolution")
    failed = parse_facts("n0", {"facts": {}, "errors": {"hostname_resolution": "gaierror"}})
    assert failed.ran("hostname_resolution") and failed.facts.hostname_resolution is None


def test_what_a_host_saw_of_its_peers_checkpoint_markers_comes_with_its_result() -> None:
    seen = parse_settled("n0", {"facts": {}, "errors": {}, "checkpoint": {"seen": ["n1"], "cleanup_error": "EPERM"}})
    assert seen is not None and (seen.seen, seen.list_error, seen.cleanup_error) == (("n1",), None, "EPERM")
    assert parse_settled("n0", {"facts": {}}) is None
