"""Check 7: NCCL_IB_DISABLE against the InfiniBand devices, NCCL_DEBUG values, memlock for RDMA."""

from __future__ import annotations

from orchestrator.checks.base import info, listing, ok, warn
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.spec import CheckSpec, Runs, implements
from orchestrator.remote.wire import MemlockFact

CHECK = "nccl"
SPEC = CheckSpec(CHECK, order=120, runs=Runs.NODE | Runs.SLURM)
DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE", "ABORT")
SUBSYSTEMS = ("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL",
              "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL")
LIMITS_FIX = ("add `* soft memlock unlimited` and `* hard memlock unlimited` to "
              "/etc/security/limits.conf (and LimitMEMLOCK=infinity for sshd), then reconnect")


def bad_subsystems(value: str) -> list[str]:
    text = value[1:] if value.startswith("^") else value
    return [s for s in (p.strip() for p in text.split(",")) if s and s.upper() not in SUBSYSTEMS]


def host_findings(host: str, env: dict[str, str], ib: list[str], memlock: MemlockFact | None) -> list[Finding]:
    out: list[Finding] = []
    disable = env.get("NCCL_IB_DISABLE")
    if ib and disable not in (None, "", "0"):
        out.append(warn(CHECK, host, f"InfiniBand devices present but NCCL_IB_DISABLE={disable}: "
                        "NCCL will use TCP sockets", f"/sys/class/infiniband: {listing(ib)}",
                        "remove NCCL_IB_DISABLE from the environment"))
    elif not ib and disable is None:
        out.append(info(CHECK, host, "no InfiniBand devices: NCCL will use TCP sockets",
                        "/sys/class/infiniband is empty or missing",
                        "set NCCL_IB_DISABLE=1 in the job's [env] to skip the IB probe"))
    level = env.get("NCCL_DEBUG")
    if level is not None and level.upper() not in DEBUG_LEVELS:
        out.append(warn(CHECK, host, f"NCCL_DEBUG={level} is not a level NCCL knows (ignored)",
                        f"valid: {', '.join(DEBUG_LEVELS[:4])}", "set NCCL_DEBUG=INFO (or WARN)"))
    subsys = env.get("NCCL_DEBUG_SUBSYS")
    if subsys is not None and bad_subsystems(subsys):
        out.append(warn(CHECK, host, f"NCCL_DEBUG_SUBSYS={subsys}: unknown subsystem(s) "
                        f"{listing(bad_subsystems(subsys))}", f"valid: {', '.join(SUBSYSTEMS)}",
                        "e.g. NCCL_DEBUG_SUBSYS=INIT,NET (a leading ^ excludes)"))
    soft = memlock.soft if memlock is not None else None
    if ib and memlock is not None and soft is not None:
        out.append(warn(CHECK, host, f"ulimit -l (memlock) is {soft // 1024} KiB with InfiniBand "
                        "present: RDMA needs unlimited", f"RLIMIT_MEMLOCK soft={soft}", LIMITS_FIX))
    if not [f for f in out if f.status.rank >= 3]:
        out.append(ok(CHECK, host, "NCCL settings are consistent" + (
            f" (IB: {listing(ib)})" if ib else "")))
    return out


@implements(SPEC)
def check(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    for host in obs.ctx.hosts:
        hf = obs.facts.get(host.name)
        if hf is None:
            continue
        env = obs.ctx.host_env(host, hf.facts.env or {})
        out += host_findings(host.name, env, list(hf.facts.infiniband or ()), hf.facts.memlock)
    return out
