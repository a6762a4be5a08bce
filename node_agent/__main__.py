"""Agent entry point: read one request from stdin, run its op, print events and one result."""

from __future__ import annotations

import importlib
import os
import sys

from node_agent.wire.protocol import PROTOCOL_VERSION, emit_result, read_request

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Callable, Dict, Optional

# op name -> "module:function". Each function takes (request, control_stream) and returns a
# JSON-able dict; an "exit_code" key in it becomes the process exit code. "_sent": the op has
# sent its result line itself (supervise and attach: through the supervisor's uplink).
OPS: Dict[str, str] = {
    "ping": "node_agent.__main__:ping",
    "facts": "node_agent.ops.facts:gather",
    "gpu_health": "node_agent.ops.gpuhealth:gather",
    "port_owners": "node_agent.ops.ports:port_owners",
    "kill_port": "node_agent.ops.ports:kill_port",
    "listen": "node_agent.ops.probe:listen",
    "connect": "node_agent.ops.probe:connect",
    "supervise": "node_agent.runtime.supervisor:supervise",
    "ps": "node_agent.ops.jobs:ps",
    "down": "node_agent.ops.jobs:down",
    "prune": "node_agent.ops.prune:prune",
    "loop": "node_agent.runtime.loops:start",
    "logs": "node_agent.ops.jobs:logs",
    "stacks": "node_agent.ops.stacks:dump",
    "top": "node_agent.ops.top:top",
    "follow": "node_agent.ops.follow:follow",
    "attach": "node_agent.runtime.attach:attach",
    "slurm_check": "node_agent.ops.slurm_probe:check",
    "authorize_key": "node_agent.ops.authkeys:authorize_key",
    "manifest": "node_agent.ops.syncdest:manifest",
    "unpack": "node_agent.ops.syncdest:unpack",
}


def ping(request: Dict[str, Any], control: Any) -> Dict[str, Any]:
    import socket

    return {
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "pid": os.getpid(),
        "protocol": PROTOCOL_VERSION,
    }


def _load(op: str) -> Callable[[Dict[str, Any], Any], Dict[str, Any]]:
    target = OPS.get(op)
    if target is None:
        raise KeyError("unknown op %r (known: %s)" % (op, ", ".join(sorted(OPS))))
    module_name, func_name = target.split(":")
    op_function: Callable[[Dict[str, Any], Any], Dict[str, Any]] = getattr(importlib.import_module(module_name),
                                                                         func_name)
    return op_function


def main(request: Optional[bytes] = None) -> int:
    """Run the request's op (its line, where the bootstrap in orchestrator/remote/agent.py read it
    already). Ends with os._exit: reader threads may still block on stdin."""
    code = _run(request)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(line: Optional[bytes]) -> int:
    control = sys.stdin.buffer
    try:
        request = read_request(control, line)
        result = _load(str(request["op"]))(request, control)
    except Exception as exc:  # an agent that crashes still answers with one JSON result
        import traceback

        from node_agent.wire.replies import wire
        from node_agent.wire.replies_run import AgentFailure, Failed

        emit_result(wire(Failed(AgentFailure(type(exc).__name__, str(exc), traceback.format_exc()))))
        return 70
    if not result.pop("_sent", False):
        emit_result(result)
    return int(result.get("exit_code", 0))


if __name__ == "__main__":
    sys.exit(main())
