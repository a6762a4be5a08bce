"""Check 1: passwordless SSH and a working agent, from the pool's per-host errors."""

from __future__ import annotations

from inventory import Host
from orchestrator.checks.base import fail, info, ok
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.spec import CheckSpec, Runs, implements
from orchestrator.errors import HostError, HostErrorKind

CHECK = "ssh"
SPEC = CheckSpec(CHECK, order=10, runs=Runs.NODE)

WHAT = {
    HostErrorKind.UNREACHABLE: "host unreachable (no route to it, or no answer before the connect timeout)",
    HostErrorKind.SSHD_DOWN: "sshd is not running or listens on another port (connection refused)",
    HostErrorKind.UNRESOLVED: "host name does not resolve",
    HostErrorKind.UNKNOWN_HOST_KEY: "unknown host key",
    HostErrorKind.CHANGED_HOST_KEY: "host key changed",
    HostErrorKind.AUTH: "key not authorized: the host refused the keys offered",
    HostErrorKind.NO_KEY: "no SSH key to offer (no usable IdentityFile, ssh-agent key or default key)",
    HostErrorKind.TIMEOUT: "timed out",
    HostErrorKind.LOST: "connection lost",
    HostErrorKind.AGENT: "the node agent failed",
    HostErrorKind.PROTOCOL: "SSH protocol error",
}

DEFAULT_FIX = {
    HostErrorKind.UNREACHABLE: "check that {host} is up and that port {port} is open from here",
    HostErrorKind.SSHD_DOWN: "on {host}: sudo systemctl start ssh (or sshd)",
    HostErrorKind.UNRESOLVED: "add {host} to /etc/hosts or DNS, or set its address in the inventory",
    HostErrorKind.UNKNOWN_HOST_KEY: "ssh-keyscan {host} >> ~/.ssh/known_hosts (after checking the "
                                    "fingerprint), or pass --accept-new-host-keys",
    HostErrorKind.CHANGED_HOST_KEY: "ssh-keygen -R {host}, then verify and record the new key",
    HostErrorKind.AUTH: "ssh-copy-id {host}",
    HostErrorKind.AGENT: "check that python3 (>= 3.8) runs on {host} in a non-interactive shell",
}


def finding_for(host: Host, err: HostError) -> Finding:
    fix = err.fix or DEFAULT_FIX.get(err.kind, "").format(host=host.address, port=host.port or 22)
    return fail(CHECK, host.name, WHAT.get(err.kind, err.kind.value),
                f"{err.kind.value}: {err.message}", fix)


@implements(SPEC)
def check(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    for host in obs.ctx.hosts:
        if host.name in obs.failed:
            out.append(finding_for(host, obs.failed[host.name]))
        elif host.name in obs.facts:
            hf = obs.facts[host.name]
            out.append(ok(CHECK, host.name,
                          f"connected, agent ran in {hf.received_at - hf.sent_at:.1f}s"))
            if hf.agent_cache.startswith(UNCACHED):
                out.append(uncached(host.name, hf.agent_cache))
    return out


UNCACHED = "not written: "  # the host's agent cache could not keep this version (remote/agent.py)


def uncached(name: str, why: str) -> Finding:
    """The host cannot keep the agent: every call sends it again. It still works."""
    return info(CHECK, name, f"every call sends the node agent to {name}: it cannot keep a copy "
                f"({why.removeprefix(UNCACHED)})",
                f"~/.cache/ddpctl (or $XDG_CACHE_HOME/ddpctl) on {name}: {why}",
                f"make ~/.cache/ddpctl writable on {name} (free space on its filesystem), or set "
                "XDG_CACHE_HOME to a writable directory for its non-interactive logins")
