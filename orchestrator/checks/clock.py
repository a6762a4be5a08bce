"""Check 9: clock skew between hosts (estimated against this machine, ± half the round trip)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from orchestrator.checks.base import ok, warn
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.spec import CheckSpec, Runs, implements
from orchestrator.remote.wire import HostFacts

CHECK = "clock"
SPEC = CheckSpec(CHECK, order=140, runs=Runs.NODE | Runs.SLURM, column="clk")
MAX_SKEW_S = 2.0


@dataclass(frozen=True)
class Offset:
    """A host clock's offset from ours, within ± uncertainty."""

    offset_s: float
    uncertainty_s: float


def offset_of(hf: HostFacts) -> Offset | None:
    """The agent read its clock after `elapsed_s` of work, so inside [sent + elapsed, received]."""
    remote = hf.facts.time
    if remote is None:
        return None
    elapsed = hf.facts.elapsed_s or 0.0
    earliest = min(hf.sent_at + elapsed, hf.received_at)
    mid = (earliest + hf.received_at) / 2
    return Offset(remote - mid, (hf.received_at - earliest) / 2)


@implements(SPEC)
def check(obs: Observations) -> list[Finding]:
    offsets = {h: o for h, hf in obs.facts.items() if (o := offset_of(hf)) is not None}
    if not offsets:
        return []
    reference = statistics.median(o.offset_s for o in offsets.values())
    out: list[Finding] = []
    for host, o in offsets.items():
        skew = o.offset_s - reference
        if abs(skew) - o.uncertainty_s > MAX_SKEW_S:
            out.append(warn(CHECK, host, f"clock on {host} is {skew:+.1f}s off the other hosts",
                            f"offset from this machine {o.offset_s:+.2f}s ± {o.uncertainty_s:.2f}s;"
                            f" hosts' median {reference:+.2f}s",
                            f"enable time sync on {host} (sudo timedatectl set-ntp true, or "
                            "chrony)"))
        else:
            out.append(ok(CHECK, host, f"clock within {MAX_SKEW_S:.0f}s of the other hosts",
                          f"offset {o.offset_s:+.2f}s ± {o.uncertainty_s:.2f}s"))
    return out
