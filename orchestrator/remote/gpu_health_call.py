"""The gpu_health op on one host, decoded (node_agent/ops/gpuhealth.py; its reply: node_agent/wire/replies_gpu.py)."""

from __future__ import annotations

from orchestrator.remote.agent import call_agent
from orchestrator.remote.transport import Transport
from orchestrator.remote.wire import GpuHealthReport, parse_gpu_health

GPU_HEALTH_TIMEOUT_S = 60.0  # nvidia-smi (up to a few queries when the driver refuses a field) and the kernel log


def call_gpu_health(transport: Transport, timeout: float = GPU_HEALTH_TIMEOUT_S) -> GpuHealthReport:
    """The host's GPU health report; its HostError where the agent could not answer."""
    reply = call_agent(transport, "gpu_health", {}, timeout=timeout)
    return parse_gpu_health(transport.host.name, reply.result)
