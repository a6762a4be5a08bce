"""Agent entry point: read one request from stdin, run its op, print events and one result."""

from __future__ import annotations

import importlib
import os
import sys

from node_agent import protocol
from node_agent.protocol import PROTOCOL_VERSION, emit_result, read_request

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Callable, Dict, Optional

# op name -> "module:function". Each function takes (request, control_stream) and returns a
# JSON-able dict; an "exit_code" key in it becomes the process exit code. "_sent": the op has
# sent its result line itself (supervise and attach: through the supervisor's uplink).
OPS: Dict[str, str] = {
    "ping": "node_agent.__main__:ping",
    "facts": "node_agent.facts:gather",
    "gpu_health": "node_agent.gpuhealth:gather",
    "port_owners": "node_agent.ports:port_owners",
    "kill_port": "node_agent.ports:kill_port",
    "listen": "node_agent.probe:listen",
    "connect": "node_agent.probe:connect",
    "supervise": "node_agent.supervisor:supervise",
    "ps": "node_agent.jobs:ps",
    "down": "node_agent.jobs:down",
    "prune": "node_agent.prune:prune",
    "loop": "node_agent.loops:start",
    "logs": "node_agent.jobs:logs",
    "stacks": "node_agent.stacks:dump",
    "top": "node_agent.top:top",
    "follow": "node_agent.follow:follow",
    "attach": "node_agent.attach:attach",
    "slurm_check": "node_agent.slurm_probe:check",
    "authorize_key": "node_agent.authkeys:authorize_key",
    "manifest": "node_agent.syncdest:manifest",
    "unpack": "node_agent.syncdest:unpack",
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
    return getattr(importlib.import_module(module_name), func_name)


def main(request: Optional[bytes] = None, cache: str = "") -> int:
    """Run the request's op (its line when the bootstrap read it; `cache`: what the agent's cache
    did, see orchestrator/remote/agent.py). Ends with os._exit: reader threads may still block on
    stdin."""
    protocol.agent_cache = cache
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

        from node_agent.replies import wire
        from node_agent.replies_run import AgentFailure, Failed

        emit_result(wire(Failed(AgentFailure(type(exc).__name__, str(exc), traceback.format_exc()))))
        return 70
    if not result.pop("_sent", False):
        emit_result(result)
    return int(result.get("exit_code", 0))


if __name__ == "__main__":
    sys.exit(main())
