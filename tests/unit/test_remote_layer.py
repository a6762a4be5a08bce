"""The remote layer: one timeout rule for both transports, one decoder of agent output, typed replies."""

from __future__ import annotations

import pytest

from inventory import LOCALHOST
from node_agent.wire.protocol import EVENT_PREFIX, RESULT_PREFIX
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.agent import AgentEvent, AgentResult, call_agent, decode, decode_chunk, parse_reply
from orchestrator.remote.transport import CommandResult, LocalTransport, OutputLine
from orchestrator.remote.wire import parse_down, parse_ps, parse_supervise


def test_a_local_command_past_its_deadline_is_a_timeout_host_error_naming_the_command() -> None:
    with pytest.raises(HostError) as info:
        LocalTransport(LOCALHOST).run(["sleep", "30"], timeout=0.3)
    err = info.value
    assert err.kind == HostErrorKind.TIMEOUT and err.host == "localhost"
    assert "did not finish within 0s: sleep 30" in err.message
    assert "python3" not in err.fix  # no misleading interpreter advice


def test_an_agent_op_past_its_deadline_on_the_local_transport_is_a_timeout_not_a_missing_python() -> None:
    with pytest.raises(HostError) as info:
        call_agent(LocalTransport(LOCALHOST), "logs", {"job": "no-such-job", "follow": True}, timeout=0.01)
    assert info.value.kind == HostErrorKind.TIMEOUT


@pytest.mark.parametrize(("line", "kind"), [
    (OutputLine("stdout", EVENT_PREFIX + '{"event": "started", "pid": 5}'), AgentEvent),
    (OutputLine("stdout", RESULT_PREFIX + '{"exit_code": 0}'), AgentResult),
    (OutputLine("stdout", "[default0]:epoch=1"), OutputLine),
    (OutputLine("stderr", EVENT_PREFIX + '{"event": "started"}'), OutputLine),  # only stdout carries events
    (OutputLine("stdout", EVENT_PREFIX + "{not json"), OutputLine),  # garbage is output, not a crash
])
def test_decode_tells_events_results_and_program_output_apart(line: OutputLine, kind: type) -> None:
    assert isinstance(decode(line), kind)


def test_parse_reply_turns_an_agent_crash_into_the_hosts_error() -> None:
    stdout = RESULT_PREFIX + '{"error": {"type": "KeyError", "message": "boom"}, "exit_code": 70}\n'
    with pytest.raises(HostError, match="the node agent failed: KeyError: boom"):
        parse_reply(CommandResult("n1", ("x",), 70, stdout, "", 0.1))
    with pytest.raises(HostError, match="gave no result"):
        parse_reply(CommandResult("n1", ("x",), 1, "hello\n", "sh: python3: not found\n", 0.1))


def test_supervise_ps_and_down_replies_are_typed() -> None:
    sup = parse_supervise({"exit_code": 1, "stop_reason": "stopped by the control plane",
                           "first_error": {"local_rank": 1, "message": "RuntimeError: x", "traceback": "tb",
                                           "timestamp": 3.5, "file": "/e.json"},
                           "nccl": {"files": ["f"], "networks": ["Socket"], "interfaces": ["eth0"],
                                    "bootstrap": [], "transports": ["P2P"]}})
    assert sup.exit_code == 1 and sup.first_error is not None and sup.first_error.local_rank == 1
    assert sup.nccl is not None and sup.nccl.interfaces == ("eth0",) and sup.error is None
    (job,) = parse_ps("n1", {"jobs": [{"job_id": "j-1", "node_rank": 0, "pid": 9, "pids": [9, 10],
                                       "uptime_s": 2.0, "detached": True, "gpu_memory_mib": None,
                                       "job_name": None, "log": None}]})
    assert (job.host, job.job_id, job.pids, job.detached) == ("n1", "j-1", (9, 10), True)
    (stopped,) = parse_down({"stopped": [{"job_id": "j-1", "terminated": [9, 10], "killed": [10],
                                          "commands": {"9": "torchrun"}, "left": []}]})
    assert stopped.killed == (10,) and stopped.commands == {9: "torchrun"}


EVENT = EVENT_PREFIX + '{"event": "out", "end": 7}'


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("stdout", "a\nb\n", [["a", "b"]]),
    ("stdout", f"a\n{EVENT}\nb\r\n", [["a"], AgentEvent("out", {"event": "out", "end": 7}), ["b"]]),
    ("stdout", f"{EVENT}\n", [AgentEvent("out", {"event": "out", "end": 7})]),
    ("stdout", f"x {EVENT}\n", [[f"x {EVENT}"]]),  # the mark inside a line of output is output
    ("stdout", "@@DDPCTL-nonsense\n", ["@@DDPCTL-nonsense"]),
    ("stderr", "w\n", [OutputLine("stderr", "w")]),
])
def test_a_chunk_decodes_to_runs_of_output_and_protocol_messages(name: str, text: str, expected: list[object]) -> None:
    assert decode_chunk(name, text) == expected
